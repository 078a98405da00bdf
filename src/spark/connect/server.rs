//! One Spark Connect server: [`ConnectServer`] serves a [`ConnectService`] over HTTP/2 with
//! bounded buffers ([`TransportLimits`]), TLS or mutual TLS, the token, `grpc.health.v1`
//! on the same port, metrics publishing, the maintenance pass and a graceful drain on a
//! shutdown future (connect §4, §7; the drain's rule is [`Drain`](crate::execution::Drain)).

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::pin;
use std::time::Duration;

use futures::StreamExt;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tower::Layer;

use super::service::{ConnectConfig, ConnectService, QueryEngine};
use super::tls::{self, AcceptedStream, ClientCertificateCheck, ServerTls, TlsPeer};
use crate::execution::DrainReport;

/// The HTTP/2 buffer settings of a bounded Spark Connect server (tether's own bound on the
/// transport of connect §4; hyper's defaults let each stream queue 400 KiB and tonic's
/// server windows are 1 MiB). Used by [`ConnectServer::limits`].
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

    /// Why these limits cannot serve, if so (connect §4 transport; HTTP/2's ranges, RFC 9113
    /// §6.5.2): a frame size outside 16 KiB ..= 16 MiB − 1, a window of 0 or above 2³¹ − 1,
    /// or a send buffer or stream limit of 0 (which would stall every client).
    ///
    /// # Errors
    /// The first field out of range, in words.
    pub fn check(&self) -> Result<(), String> {
        const MAX_WINDOW: u32 = (1 << 31) - 1;
        if !(16_384..=16_777_215).contains(&self.max_frame_size) {
            return Err(format!(
                "max_frame_size {} is outside HTTP/2's 16384 ..= 16777215",
                self.max_frame_size
            ));
        }
        for (name, window) in [
            ("stream_window", self.stream_window),
            ("connection_window", self.connection_window),
        ] {
            if window == 0 || window > MAX_WINDOW {
                return Err(format!(
                    "{name} {window} is outside HTTP/2's 1 ..= {MAX_WINDOW}"
                ));
            }
        }
        if self.max_send_buf_size == 0 {
            return Err("max_send_buf_size 0 would stall every response".into());
        }
        if self.max_concurrent_streams == 0 {
            return Err("max_concurrent_streams 0 would refuse every request".into());
        }
        Ok(())
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

/// How long a stopping [`ConnectServer`] waits, after its drain, for the streams still open
/// to end gracefully (5 s; tether's own bound on connect §4's transport).
pub const STOP_WAIT: Duration = Duration::from_secs(5);

/// How long a stopping [`ConnectServer`] waits for its connections to end once it closed
/// those whose streams reached no handler (2 s; tether's own bound on connect §4's transport). So a server stops at most the drain's
/// deadline + [`DRAIN_GRACE`](crate::execution::DRAIN_GRACE) + [`STOP_WAIT`] +
/// `CLOSE_WAIT` (deadline + 12 s) after its shutdown future resolved.
pub const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// A Spark Connect server (connect §4, §7; tonic's `transport::Server` is the shape): one
/// builder that composes TLS or mutual TLS ([`ServerTls`]), the token, the bounded HTTP/2
/// transport ([`TransportLimits`]), the standard `grpc.health.v1` service on the same port
/// ([`ConnectHealth`](super::ConnectHealth)), the manager's maintenance pass and metrics
/// publishing, and a graceful drain when the shutdown future resolves, returning the
/// drain's [`DrainReport`].
///
/// A server with TLS, a token, metrics and a graceful drain, as `examples/connect_server`
/// runs it (PySpark connects with `sc://HOST:PORT/;use_ssl=true;token=TOKEN`, trusting the
/// server's CA through `GRPC_DEFAULT_SSL_ROOTS_FILE_PATH`); a `metrics` recorder installed
/// before the manager is built receives tether's metrics (`tether::observe`):
///
/// ```no_run
#[doc = include_str!("../../../examples/connect_server/serve.rs")]
/// ```
///
/// What it does on its own: `TCP_NODELAY` on every connection; over TLS, a plaintext client
/// is answered in words ([`tls::PLAINTEXT_REFUSAL`]), a handshake must end within
/// [`tls::HANDSHAKE_TIMEOUT`], and with mutual TLS a client without a certificate is
/// answered `UNAUTHENTICATED` ([`tls::NO_CLIENT_CERTIFICATE`]) except for health checks;
/// every connection closes gracefully (a lingering close, so a TLS alert is not overtaken
/// by a reset); the maintenance pass ([`ExecutionManager::run_maintenance`](crate::execution::ExecutionManager::run_maintenance))
/// runs unless [`without_maintenance`](Self::without_maintenance).
///
/// When `shutdown` resolves: [`ConnectService::drain`] (health `NOT_SERVING`, new work
/// refused with the retryable `SERVER_DRAINING`, what runs served until the deadline, then
/// canceled with every connection closed so clients read `OPERATION_CANCELED` now); new
/// connections are still accepted meanwhile, so that clients reattach and release. Then
/// the connections end gracefully within [`STOP_WAIT`]; if streams that reached no handler
/// are still open (a request whose body never came), their connections are closed, and
/// after [`CLOSE_WAIT`] whatever is still open is dropped (logged at WARN). To stop at once
/// on a second signal, race the returned future against it.
pub struct ConnectServer<E> {
    service: ConnectService<E>,
    tls: Option<ServerTls>,
    token: Option<String>,
    limits: TransportLimits,
    drain_deadline: Duration,
    drain_grace: Duration,
    publish_metrics: Option<Duration>,
    maintenance: bool,
}

impl<E> std::fmt::Debug for ConnectServer<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectServer")
            .field("tls", &self.tls.is_some())
            .field("token", &self.token.is_some())
            .field("limits", &self.limits)
            .field("drain_deadline", &self.drain_deadline)
            .field("drain_grace", &self.drain_grace)
            .field("publish_metrics", &self.publish_metrics)
            .field("maintenance", &self.maintenance)
            .finish_non_exhaustive()
    }
}

impl<E: QueryEngine> ConnectServer<E> {
    /// A plaintext server of `service`, without a token, with [`TransportLimits::default`],
    /// a 30 s drain deadline, the maintenance pass, and the metrics published only by the
    /// maintenance pass (connect §4).
    pub fn new(service: ConnectService<E>) -> Self {
        Self {
            service,
            tls: None,
            token: None,
            limits: TransportLimits::default(),
            drain_deadline: Duration::from_secs(30),
            drain_grace: crate::execution::DRAIN_GRACE,
            publish_metrics: None,
            maintenance: true,
        }
    }

    /// Serves TLS, or mutual TLS when `tls` has a client CA (connect §7.1).
    pub fn tls(mut self, tls: ServerTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Requires every RPC to carry `authorization: Bearer <token>` (connect §4; Spark's
    /// `spark.connect.authenticate.token`), except health checks. PySpark sends a token
    /// only over TLS. A token no client can send is refused by [`serve`](Self::serve)
    /// ([`check_token`](super::check_token)).
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// The HTTP/2 buffer bounds (default [`TransportLimits::default`]; connect §4 transport).
    pub fn limits(mut self, limits: TransportLimits) -> Self {
        self.limits = limits;
        self
    }

    /// How long the drain serves running executions after the shutdown future resolved
    /// before it cancels them (default 30 s; [`Drain`](crate::execution::Drain), rx §2.2 T9).
    pub fn drain_deadline(mut self, deadline: Duration) -> Self {
        self.drain_deadline = deadline;
        self
    }

    /// How long the drain waits after its deadline for clients to read their
    /// `OPERATION_CANCELED` and release, and how long an execution may be detached during
    /// the drain before it is abandoned (default
    /// [`DRAIN_GRACE`](crate::execution::DRAIN_GRACE), 5 s; rx §5.3,
    /// [`Drain::with_grace`](crate::execution::Drain::with_grace)). Slow readers need more:
    /// see [`DrainReport::untold`](crate::execution::DrainReport::untold).
    pub fn drain_grace(mut self, grace: Duration) -> Self {
        self.drain_grace = grace;
        self
    }

    /// Hands the manager's counters, gauges and histograms to the `metrics` recorder every
    /// `period` ([`ExecutionManager::publish_metrics`](crate::execution::ExecutionManager::publish_metrics)),
    /// so that scrapes are at most `period` late (without it, each maintenance pass
    /// publishes them, every `ManagerConfig::maintenance_interval`, rx §5.3).
    pub fn publish_metrics_every(mut self, period: Duration) -> Self {
        self.publish_metrics = Some(period.max(Duration::from_millis(1)));
        self
    }

    /// Does not run the manager's maintenance pass (the caller runs
    /// [`run_maintenance`](crate::execution::ExecutionManager::run_maintenance) or
    /// [`maintain`](crate::execution::ExecutionManager::maintain) itself; rx §5.3, §5.6).
    pub fn without_maintenance(mut self) -> Self {
        self.maintenance = false;
        self
    }

    /// The service served (connect §4).
    pub fn service(&self) -> &ConnectService<E> {
        &self.service
    }

    /// Serves on `listener` until `shutdown` resolves, then drains and stops (type docs;
    /// connect §4, §7).
    ///
    /// # Errors
    /// `InvalidInput` when the token is one no client can send
    /// ([`check_token`](super::check_token)) or the limits cannot serve
    /// ([`TransportLimits::check`]). Failures to accept a connection are logged and
    /// retried, not returned.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> io::Result<DrainReport> {
        let Self {
            service,
            tls,
            token,
            limits,
            drain_deadline,
            drain_grace,
            publish_metrics,
            maintenance,
        } = self;
        if let Some(token) = &token {
            super::check_token(token)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        }
        limits
            .check()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let manager = service.manager().clone();
        let mut background = JoinSet::new();
        if maintenance {
            background.spawn(manager.clone().run_maintenance());
            // Artifacts of sessions that expired go with them, on the same interval.
            let service = service.clone();
            let period = manager.config().maintenance_interval;
            background.spawn(async move {
                let mut tick = tokio::time::interval(period.max(Duration::from_millis(1)));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    service.sweep_artifacts();
                }
            });
        }
        if let Some(period) = publish_metrics {
            let manager = manager.clone();
            background.spawn(async move {
                let mut tick = tokio::time::interval(period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    manager.publish_metrics();
                }
            });
        }
        let check = ClientCertificateCheck::new(
            tls.as_ref()
                .is_some_and(ServerTls::requires_client_certificate),
        );
        let routes = tonic::service::Routes::new(service.health().service().await)
            .add_service(service.clone().into_service(&ConnectConfig { token }))
            .prepare();
        let app = check.layer(routes);
        let acceptor = tls.map(|tls| tokio_rustls::TlsAcceptor::from(tls.rustls_config()));
        let incoming: futures::stream::BoxStream<'static, io::Result<AcceptedStream>> =
            if acceptor.is_some() {
                Box::pin(tls::incoming(listener))
            } else {
                Box::pin(plaintext(listener))
            };
        let mut incoming = pin!(service.connections(incoming));
        let builder = limits.builder();
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let mut connections = JoinSet::new();
        let drain = async {
            shutdown.await;
            tracing::info!(
                deadline_ms = drain_deadline.as_millis() as u64,
                "draining: health NOT_SERVING, new sessions and executions refused"
            );
            service.drain_with_grace(drain_deadline, drain_grace).await
        };
        let mut drain = pin!(drain);
        let report = loop {
            let accepted = tokio::select! {
                report = drain.as_mut() => break report,
                accepted = incoming.next() => accepted,
            };
            match accepted {
                Some(Ok(connection)) => {
                    let builder = builder.clone();
                    let app = app.clone();
                    let acceptor = acceptor.clone();
                    let mut stopping = stopping.clone();
                    connections.spawn(async move {
                        let tcp = connection.get_ref().get_ref();
                        let mut peer = TlsPeer {
                            remote: tcp.peer_addr().ok(),
                            local: tcp.local_addr().ok(),
                            certificates: false,
                        };
                        let io = match acceptor {
                            None => tokio_util::either::Either::Left(connection),
                            Some(acceptor) => {
                                let handshake = tokio::time::timeout(
                                    tls::HANDSHAKE_TIMEOUT,
                                    acceptor.accept(connection),
                                );
                                // A handshake still under way when the server stops is dropped: it
                                // holds nothing of the service.
                                let handshake = tokio::select! {
                                    done = handshake => done,
                                    _ = stopping.wait_for(|s| *s) => return,
                                };
                                match handshake {
                                    Ok(Ok(stream)) => {
                                        peer.certificates = stream
                                            .get_ref()
                                            .1
                                            .peer_certificates()
                                            .is_some_and(|c| !c.is_empty());
                                        tokio_util::either::Either::Right(stream)
                                    }
                                    Ok(Err(e)) => {
                                        tracing::debug!(peer = ?peer.remote, error = %e, "TLS handshake failed");
                                        return;
                                    }
                                    Err(_) => {
                                        tracing::debug!(peer = ?peer.remote, "TLS handshake timed out");
                                        return;
                                    }
                                }
                            }
                        };
                        let service = PerConnection { app, peer };
                        let mut connection = pin!(builder.serve_connection(
                            TokioIo::new(io),
                            TowerToHyperService::new(service)
                        ));
                        tokio::select! {
                            _ = connection.as_mut() => return,
                            _ = stopping.wait_for(|s| *s) => connection.as_mut().graceful_shutdown(),
                        }
                        let _ = connection.await;
                    });
                    while connections.try_join_next().is_some() {}
                }
                Some(Err(e)) if is_peer_error(&e) => {}
                Some(Err(e)) => {
                    // Out of file descriptors and the like: wait a moment rather than spin.
                    tracing::error!(error = %e, "accepting a Spark Connect connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                None => break drain.await,
            }
        };
        tracing::info!(report = %report, "drained");
        let _ = stop.send(true);
        if ended(&mut connections, STOP_WAIT).await.is_err() {
            if manager.execution_count() == 0 && service.rpcs_in_flight() == 0 {
                // What is still open holds nothing of the service: requests that reached no
                // handler (a body that never came).
                service.close_connections();
                tracing::info!(
                    "streams that reached no handler still open after the drain: closed their \
                     connections"
                );
            }
            if ended(&mut connections, CLOSE_WAIT).await.is_err() {
                tracing::warn!(
                    connections = connections.len(),
                    "connections still open after the drain: dropped"
                );
                connections.shutdown().await;
            }
        }
        background.shutdown().await;
        Ok(report)
    }
}

/// Whether every task of `connections` ended within `wait`.
async fn ended(
    connections: &mut JoinSet<()>,
    wait: Duration,
) -> Result<(), tokio::time::error::Elapsed> {
    tokio::time::timeout(wait, async {
        while connections.join_next().await.is_some() {}
    })
    .await
}

/// The accepted connections of a plaintext listener, `TCP_NODELAY` on.
fn plaintext(listener: TcpListener) -> impl futures::Stream<Item = io::Result<AcceptedStream>> {
    futures::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| {
            let _ = stream.set_nodelay(true);
            AcceptedStream::new(stream)
        });
        Some((accepted, listener))
    })
}

fn is_peer_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
    )
}

/// The server's services for one connection: hyper's request bodies as tonic's, with the
/// connection's addresses (tonic's `TcpConnectInfo`, so `Request::remote_addr` works) and
/// whether it presented a client certificate ([`TlsPeer`]) in each request's extensions.
#[derive(Clone)]
struct PerConnection<S> {
    app: S,
    peer: TlsPeer,
}

type HttpRequest<B> = http::Request<B>;
type HttpResponse = http::Response<tonic::body::Body>;

impl<S> tower::Service<HttpRequest<hyper::body::Incoming>> for PerConnection<S>
where
    S: tower::Service<HttpRequest<tonic::body::Body>, Response = HttpResponse, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = HttpResponse;
    type Error = Infallible;
    type Future = futures::future::BoxFuture<'static, Result<HttpResponse, Infallible>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        self.app.poll_ready(cx)
    }

    fn call(&mut self, request: HttpRequest<hyper::body::Incoming>) -> Self::Future {
        let mut request = request.map(tonic::body::Body::new);
        request
            .extensions_mut()
            .insert(tonic::transport::server::TcpConnectInfo {
                local_addr: self.peer.local,
                remote_addr: self.peer.remote,
            });
        request.extensions_mut().insert(self.peer.clone());
        Box::pin(self.app.call(request))
    }
}
