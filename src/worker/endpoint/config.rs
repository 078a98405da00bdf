//! [`EndpointConfig`]: what a worker-side session accepts, its bounds and its two timeouts.

use std::sync::Arc;
use std::time::Duration;

use crate::time::Timer;
use crate::wire::UdfWorkerDataFormat;

/// Configuration of a worker-side session ([`WorkerCore`](super::WorkerCore) and
/// [`Endpoint`](super::Endpoint)): the `Init` checks of udf §1.3 and the bounds and the two
/// waits of the worker's side of udf §2.
///
/// The [`Default`] accepts protocol version 1 (the reference worker's, udf §7) with
/// [`UdfWorkerDataFormat::Arrow`] data, payloads up to 1 GiB, buffers 64 input batches,
/// waits at most 30 s for the engine's `Init` on a new session and at most 30 s for the
/// engine's `Cancel` after the worker reported an error (on
/// [`TokioTimer`](crate::time::TokioTimer), feature `tokio`; on
/// [`NoTimeouts`](crate::time::NoTimeouts) it waits indefinitely).
#[derive(Debug, Clone)]
pub struct EndpointConfig {
    /// The data formats this worker declared in its `WorkerCapabilities`
    /// (`supported_data_formats`, udf §1.9). An `Init` whose `data_format` is not listed,
    /// is `UNSPECIFIED` or is an unknown numeric value is rejected with a `ProtocolError` in
    /// the `InitResponse` (udf §1.3). Listing `Unspecified` here does not make it acceptable.
    pub supported_data_formats: Vec<UdfWorkerDataFormat>,
    /// The protocol revision this worker speaks (1, as the reference worker, udf §7). An
    /// `Init` whose `protocol_version` is set to anything else is rejected with a
    /// `ProtocolError` in the `InitResponse`; an unset version means the initial revision and
    /// is accepted (udf §1.3).
    pub protocol_version: u32,
    /// Upper bound, in bytes, of an assembled UDF payload (inline plus chunks, udf §1.3). A
    /// chunked payload growing beyond it is a protocol violation: the worker does not buffer
    /// unbounded input. Default 1 GiB, tether's own bound (the protocol sets none).
    pub max_payload_size: u64,
    /// Most received `DataRequest`s buffered before the endpoint stops reading from the
    /// connection (backpressure to the engine, the part HTTP/2 flow control plays in Spark,
    /// udf §1.4). Default 64 batches; at least 1 is used. See also
    /// [`input_buffer_bytes`](Self::input_buffer_bytes): reading stops at whichever bound
    /// is reached first.
    pub input_buffer: usize,
    /// Most payload bytes (the `DataRequest.data` lengths) buffered before the endpoint
    /// stops reading from the connection: the byte bound beside
    /// [`input_buffer`](Self::input_buffer), as HTTP/2's flow-control window bounds a gRPC
    /// stream in bytes (udf §1.4; RFC 9113 §6.9.2's initial window is 65 535 bytes). An
    /// empty buffer always takes one more batch, so a batch larger than the bound still
    /// passes. Default 64 KiB.
    ///
    /// Why so little: the transport keeps its own buffer (the socket's, the HTTP/2
    /// window), so a deeper queue here adds no overlap, only memory the batches wait in.
    /// A worker that reads 64 batches of 64 KiB ahead holds 4 MiB per session, which
    /// falls out of the CPU caches before the UDF reads it; with many sessions per worker
    /// that costs more CPU per byte than the protocol itself (`benches/scaling.rs`,
    /// docs/benchmarks.md "Scaling"). Small batches still queue up to `input_buffer` of them.
    pub input_buffer_bytes: usize,
    /// How long a new session waits for the engine's first message, its `Init` (udf §2: `Init`
    /// opens every stream, §4.6). On expiry the session ends
    /// [`TransportFailed`](super::EndpointOutcome::TransportFailed) with an
    /// [`InitTimeout`](super::InitTimeout) cause and nothing is sent (the peer may not be an
    /// engine at all; as for a dead stream, udf §2 R8): a connection that never sends `Init`
    /// would otherwise hold its session slot, for example one of a framed worker's
    /// (`WorkerMain::with_max_framed_sessions`), for ever. A `Cancel` before the `Init` is
    /// answered as usual and ends the wait. `None` waits indefinitely.
    ///
    /// Default 30 s, Spark's `initResponseTimeoutMs` (udf §7): Spark's engine writes `Init`
    /// as soon as it opens the stream (udf §4.6 step 3) and gives up on the whole init exchange after 30 s
    /// (Cancel and `TransportFailed`, udf §4.6 step 4), so an engine still silent after that
    /// long has abandoned the stream; a shorter default could cut off a real engine delayed
    /// by a loaded machine.
    pub init_timeout: Option<Duration>,
    /// How long to wait for the engine's `Cancel` after the worker sent its own
    /// `ErrorResponse` or `InitResponse.error` (the engine MUST send one, udf §2 R4). On
    /// expiry the worker closes the stream with `CancelResponse(error = ProtocolError)`.
    /// `None` waits indefinitely. Default 30 s, Spark's terminal timeout (udf §7).
    pub cancel_timeout: Option<Duration>,
    /// The clock [`init_timeout`](Self::init_timeout) (udf §4.6) and
    /// [`cancel_timeout`](Self::cancel_timeout) (udf §2 R4) run on:
    /// [`TokioTimer`](crate::time::TokioTimer) by default (which needs a tokio runtime when
    /// a timeout is armed), or [`NoTimeouts`](crate::time::NoTimeouts) to disable both.
    pub timer: Arc<dyn Timer>,
}

impl EndpointConfig {
    /// [`with_timer`](Self::with_timer) on [`TokioTimer`](crate::time::TokioTimer) (feature
    /// `tokio`): the defaults listed on [`EndpointConfig`] (udf §2.1, §7).
    #[cfg(feature = "tokio")]
    pub fn new() -> Self {
        Self::with_timer(Arc::new(crate::time::TokioTimer))
    }

    /// The defaults listed on [`EndpointConfig`], with both deadlines on `timer`: the
    /// reference worker's protocol version and ARROW format (udf §2.1, §1.9), a 30 s `Init`
    /// wait (udf §7 `initResponseTimeoutMs`) and a 30 s Cancel wait (udf §7
    /// `terminalTimeoutMs`).
    pub fn with_timer(timer: Arc<dyn Timer>) -> Self {
        Self {
            supported_data_formats: vec![UdfWorkerDataFormat::Arrow],
            protocol_version: 1,
            max_payload_size: 1 << 30,
            input_buffer: 64,
            input_buffer_bytes: 64 * 1024,
            init_timeout: Some(Duration::from_secs(30)),
            cancel_timeout: Some(Duration::from_secs(30)),
            timer,
        }
    }

    /// Whether `data_format` (the raw `Init.data_format` value) is one this worker accepts:
    /// a known, specified format listed in
    /// [`supported_data_formats`](Self::supported_data_formats) (the rule of udf §1.3,
    /// field 2).
    pub fn accepts_data_format(&self, data_format: i32) -> bool {
        match UdfWorkerDataFormat::try_from(data_format) {
            Ok(UdfWorkerDataFormat::Unspecified) | Err(_) => false,
            Ok(format) => self.supported_data_formats.contains(&format),
        }
    }
}

/// [`EndpointConfig::new`]: the defaults on tokio's clock (udf §7).
#[cfg(feature = "tokio")]
impl Default for EndpointConfig {
    fn default() -> Self {
        Self::new()
    }
}
