//! Serving the Spark Connect service over HTTP/2 with bounded buffers (connect §4: the
//! service behind tonic; the bounds are tether's own).

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::pin;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use super::service::{ConnectGrpcService, QueryEngine};

/// The HTTP/2 buffer settings of a bounded Spark Connect server (tether's own bound on the
/// transport of connect §4; hyper's defaults let each stream queue 400 KiB and tonic's
/// server windows are 1 MiB). Used by [`serve_bounded`].
///
/// Together with [`MemoryBudget`](crate::execution::MemoryBudget) (rx §3.1 ranges) they
/// give the server's stated total: budget + [`bound`](Self::bound) for the streams and
/// connections served + a fixed base.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TransportLimits {
    /// Flow-control window the server grants each client stream for its requests (bytes;
    /// HTTP/2 `SETTINGS_INITIAL_WINDOW_SIZE`, connect §4). Default 64 KiB.
    pub stream_window: u32,
    /// Flow-control window the server grants each connection (bytes). Default 1 MiB.
    pub connection_window: u32,
    /// Largest HTTP/2 frame the server accepts (bytes; 16 KiB to 16 MiB). Default 16 KiB.
    pub max_frame_size: u32,
    /// Most response bytes hyper queues per stream beyond what the peer's window lets out
    /// (hyper's `max_send_buf_size`, default 400 KiB there). Default 64 KiB.
    pub max_send_buf_size: usize,
    /// Most concurrent streams per connection (ExecutePlan and ReattachExecute streams of
    /// many executions multiplexed on one channel). Default 4 096.
    pub max_concurrent_streams: u32,
}

impl Default for TransportLimits {
    fn default() -> Self {
        Self {
            stream_window: 64 * 1024,
            connection_window: 1024 * 1024,
            max_frame_size: 16 * 1024,
            max_send_buf_size: 64 * 1024,
            max_concurrent_streams: 4_096,
        }
    }
}

/// tonic's encoder gathers responses into one chunk until it reaches 32 KiB, then hands the
/// chunk (which may end with one whole response past that) to hyper.
const TONIC_CHUNK: u64 = 32 * 1024;
/// tonic allocates an 8 KiB encode buffer per stream up front.
const TONIC_ENCODE_BUFFER: u64 = 8 * 1024;
/// A gRPC message's length prefix.
const GRPC_PREFIX: u64 = 5;

impl TransportLimits {
    /// The most response bytes one server stream can hold in the transport when no
    /// response is larger than `largest_response` encoded bytes (connect §4 transport;
    /// tether's bound): hyper's send queue, plus one chunk tonic hands it past that queue
    /// (32 KiB plus one response), plus tonic's encode buffer.
    pub fn per_stream_bound(&self, largest_response: u64) -> u64 {
        (self.max_send_buf_size as u64)
            .saturating_add(TONIC_CHUNK)
            .saturating_add(largest_response.saturating_add(GRPC_PREFIX))
            .saturating_add(TONIC_ENCODE_BUFFER)
    }

    /// The most bytes one connection buffers besides its streams' (connect §4 transport;
    /// tether's bound): request bytes within the connection window, and the frame being
    /// written and read.
    pub fn per_connection_bound(&self) -> u64 {
        u64::from(self.connection_window).saturating_add(2 * u64::from(self.max_frame_size))
    }

    /// The transport's bound for `streams` response streams over `connections` connections
    /// (connect §4 transport; tether's bound): what a server adds to its
    /// [`MemoryBudget`](crate::execution::MemoryBudget)'s bound to state its total.
    pub fn bound(&self, streams: u64, connections: u64, largest_response: u64) -> u64 {
        streams
            .saturating_mul(self.per_stream_bound(largest_response))
            .saturating_add(connections.saturating_mul(self.per_connection_bound()))
    }

    /// The HTTP/2 server these limits configure (connect §4 transport).
    fn builder(&self) -> auto::Builder<TokioExecutor> {
        let mut builder = auto::Builder::new(TokioExecutor::new()).http2_only();
        builder
            .http2()
            .initial_stream_window_size(self.stream_window)
            .initial_connection_window_size(self.connection_window)
            .adaptive_window(false)
            .max_frame_size(self.max_frame_size)
            .max_send_buf_size(self.max_send_buf_size)
            .max_concurrent_streams(self.max_concurrent_streams);
        builder
    }
}

/// Serves `service` on `listener` over HTTP/2 with `limits` (connect §4 transport, tether's
/// bound; `TCP_NODELAY` on as [`ConnectService::into_service`](super::ConnectService::into_service)
/// asks) until `shutdown` resolves, then stops accepting and lets open connections finish
/// gracefully. What `tonic::transport::Server` does, except that its send buffer is fixed
/// at hyper's 400 KiB per stream.
///
/// Plaintext only, on a bare listener, serving this one service: it does not combine with
/// TLS ([`tls`](super::tls)), the health service or
/// [`ConnectService::connections`](super::ConnectService::connections) (which a drain needs
/// to close connections at its deadline). A server that needs those serves with tonic's
/// server, as `examples/connect_server` does, and its send buffers are hyper's.
///
/// # Errors
/// Accepting a connection failed for a reason other than the peer's.
pub async fn serve_bounded<E: QueryEngine>(
    service: ConnectGrpcService<E>,
    listener: TcpListener,
    limits: TransportLimits,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let builder = limits.builder();
    let mut shutdown = pin!(shutdown);
    let (drain, draining) = tokio::sync::watch::channel(false);
    let mut connections = JoinSet::new();
    let result = loop {
        let (stream, _) = tokio::select! {
            () = shutdown.as_mut() => break Ok(()),
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) if is_peer_error(&e) => continue,
                Err(e) => break Err(e),
            },
        };
        let _ = stream.set_nodelay(true);
        let builder = builder.clone();
        let service = HyperToTonic(service.clone());
        let mut draining = draining.clone();
        connections.spawn(async move {
            let mut connection = pin!(
                builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service))
            );
            tokio::select! {
                _ = connection.as_mut() => return,
                _ = draining.wait_for(|d| *d) => connection.as_mut().graceful_shutdown(),
            }
            let _ = connection.await;
        });
        while connections.try_join_next().is_some() {}
    };
    let _ = drain.send(true);
    while connections.join_next().await.is_some() {}
    result
}

fn is_peer_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
    )
}

/// The service over hyper's request bodies (tonic's own server does this conversion).
struct HyperToTonic<E>(ConnectGrpcService<E>);

impl<E> Clone for HyperToTonic<E> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

type HttpRequest<B> = tonic::codegen::http::Request<B>;
type HttpResponse = tonic::codegen::http::Response<tonic::body::Body>;

impl<E: QueryEngine> tower::Service<HttpRequest<hyper::body::Incoming>> for HyperToTonic<E> {
    type Response = HttpResponse;
    type Error = Infallible;
    type Future = futures::future::BoxFuture<'static, Result<HttpResponse, Infallible>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        tower::Service::<HttpRequest<tonic::body::Body>>::poll_ready(&mut self.0, cx)
    }

    fn call(&mut self, request: HttpRequest<hyper::body::Incoming>) -> Self::Future {
        tower::Service::call(&mut self.0, request.map(tonic::body::Body::new))
    }
}
