//! Session timeouts, buffer bounds and the timer they run on (udf §7).

use std::sync::Arc;
use std::time::Duration;

use super::events::WorkerEvent;
use crate::observe::EventSender;
use crate::time::Timer;

/// Timeouts and bounds of an engine-side worker session. Defaults are Spark's (udf §7).
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// Total wait for `InitResponse` after `Init` (udf §7 `initResponseTimeoutMs`, 30 s).
    /// Expiry sends Cancel and settles `TransportFailed(Timeout)`. Not a worker process's
    /// start-up deadline (a dispatcher's `default_init_timeout`, the spec's
    /// `initialization_timeout_ms`).
    pub init_timeout: Duration,
    /// Per-poll wait for the next worker event while streaming, and total wait for the
    /// terminator in `close`/after an init error (udf §7 `terminalTimeoutMs`, 30 s). Expiry
    /// settles `TransportFailed(Timeout)`.
    pub terminal_timeout: Duration,
    /// How long drop cleanup (the Rust form of an interrupt) waits for the Cancel
    /// acknowledgement before settling `Interrupted` (udf §7 `interruptCancelTimeoutMs`, 2 s).
    pub interrupt_cancel_timeout: Duration,
    /// Most received `DataResponse`s buffered before the session stops reading from the
    /// connection (backpressure to the worker); default 64 batches, at least 1 is used.
    /// tether's bound: Spark's output queue is unbounded (udf §10 gap 2, SPARK-55278). See
    /// also [`output_buffer_bytes`](Self::output_buffer_bytes): reading stops at whichever
    /// bound is reached first.
    pub output_buffer: usize,
    /// Most payload bytes (the `DataResponse.data` lengths, udf §1.4) buffered before the
    /// session stops reading from the connection: the byte bound beside
    /// [`output_buffer`](Self::output_buffer), as an HTTP/2 stream's flow-control window
    /// (RFC 9113 §6.9.2: 65 535 bytes initially). An empty buffer always takes one more
    /// batch, so a batch larger than the bound still passes. Default 64 KiB.
    ///
    /// Why so little: the transport keeps its own buffer (the socket's, the HTTP/2
    /// window), so a deeper queue adds no overlap, only memory where received batches wait
    /// until they are no longer in the CPU caches when the consumer reads them (the worker
    /// side's read-ahead measured so, `EndpointConfig::input_buffer_bytes`, docs/benchmarks.md
    /// "Scaling"). Small batches still queue up to `output_buffer` of them.
    pub output_buffer_bytes: usize,
    /// The clock the three udf §7 deadlines above run on: [`TokioTimer`](crate::time::TokioTimer)
    /// by default, a [`ManualClock`](crate::time::ManualClock) in simulations, or
    /// [`NoTimeouts`](crate::time::NoTimeouts) to disable every timeout explicitly.
    pub timer: Arc<dyn Timer>,
    /// Where a session made with [`Session::new`](super::Session::new) sends its lifecycle
    /// events (see [`observe`](crate::observe)): the sending half of an
    /// [`event_channel`](crate::observe::event_channel), or `None` (the default). A session
    /// reports its udf §4.1 states (created, initialized, terminated with its
    /// [`Termination`](super::Termination)). A `worker::dispatcher::Dispatcher` (feature
    /// `tokio`) does not use it: its sessions and worker processes (udf §6) report to its
    /// own `DispatcherConfig::events`, and it records the metrics of both.
    pub events: Option<EventSender<WorkerEvent>>,
}

impl SessionConfig {
    /// Spark's defaults (udf §7 `initResponseTimeoutMs`, `terminalTimeoutMs`,
    /// `interruptCancelTimeoutMs`): 30 s init, 30 s terminal, 2 s interrupt-cancel; plus
    /// tether's output buffer of 64 batches or 64 KiB; every deadline on `timer`; no event
    /// channel.
    pub fn with_timer(timer: Arc<dyn Timer>) -> Self {
        Self {
            init_timeout: Duration::from_secs(30),
            terminal_timeout: Duration::from_secs(30),
            interrupt_cancel_timeout: Duration::from_secs(2),
            output_buffer: 64,
            output_buffer_bytes: 64 * 1024,
            timer,
            events: None,
        }
    }

    /// [`with_timer`](Self::with_timer) on [`TokioTimer`](crate::time::TokioTimer) (feature
    /// `tokio`): Spark's defaults (udf §7).
    #[cfg(feature = "tokio")]
    pub fn new() -> Self {
        Self::with_timer(Arc::new(crate::time::TokioTimer))
    }
}

/// [`SessionConfig::new`]: Spark's defaults on tokio's clock (udf §7).
#[cfg(feature = "tokio")]
impl Default for SessionConfig {
    fn default() -> Self {
        Self::new()
    }
}
