//! A tonic client of Spark Connect: the [`ExecutionRpc`] that
//! [`ReattachingStream`](crate::execution::client::ReattachingStream) runs over, usable
//! against any Spark Connect server, real Spark included (rx §1.1, §6; connect §4).

use futures::future::BoxFuture;
use futures::stream::{BoxStream, StreamExt};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use super::MAX_MESSAGE_SIZE;
use super::auth::TokenSend;
use super::generated::spark_connect_service_client::SparkConnectServiceClient;
use super::status::to_rpc_error;
use crate::execution::client::{ExecutionRpc, RpcError};
use crate::wire::connect::{
    AnalyzePlanRequest, AnalyzePlanResponse, ConfigRequest, ConfigResponse, ExecutePlanRequest,
    ExecutePlanResponse, InterruptRequest, InterruptResponse, ReattachExecuteRequest,
    ReleaseExecuteRequest, ReleaseExecuteResponse, ReleaseSessionRequest, ReleaseSessionResponse,
};

/// Why a [`ConnectClient`] could not be built (rx §6.1: connecting is not yet an RPC, so
/// these are not retried).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectClientError {
    /// The address is not a valid URI (expected `http://host:port`).
    #[error("invalid Spark Connect address {address:?}")]
    Address {
        /// The address as given.
        address: String,
        /// What the URI parser said.
        #[source]
        source: tonic::transport::Error,
    },
    /// The token cannot travel in an HTTP header (connect §4).
    #[error("the authentication token contains characters not allowed in a header")]
    Token(#[source] tonic::metadata::errors::InvalidMetadataValue),
    /// The server could not be reached, or (over TLS) the handshake failed; the source
    /// says why (for example `invalid peer certificate: UnknownIssuer`, connect §7.1).
    #[error("could not connect to the Spark Connect server")]
    Connect(#[source] tonic::transport::Error),
    /// [`ConnectClient::connect_tls`] was given an address that is not `https://` (tonic
    /// would connect to it in plaintext, connect §7.1).
    #[error("a TLS connection needs an https:// address, not {address:?}")]
    NotHttps {
        /// The address as given.
        address: String,
    },
    /// The server ended a mutual-TLS connection right after the handshake, before
    /// answering anything: it refused the client certificate (signed by a CA it does not
    /// trust, expired, …; connect §7.1). `detail` is what the transport said, the TLS alert
    /// when it arrived first.
    #[error(
        "the server ended the connection right after the TLS handshake: it refused the client \
         certificate ({detail})"
    )]
    ClientCertificateRefused {
        /// The transport's error.
        detail: String,
    },
    /// [`ConnectClient::with_header`] refused a header (connect §3 metadata).
    #[error("the header {name:?} cannot be sent: {reason}")]
    Header {
        /// The header's name as given.
        name: String,
        /// Why: reserved, binary, not lower case, or a value a header cannot carry.
        reason: &'static str,
    },
    /// tonic refused the TLS configuration for this address (connect §7.1).
    #[error("the TLS configuration cannot be used for {address:?}")]
    Tls {
        /// The address as given.
        address: String,
        /// What tonic said.
        #[source]
        source: tonic::transport::Error,
    },
}

/// Whether the server kept a new mutual-TLS connection (connect §7.1): one unary call; any
/// status the server sends (`OK`, `UNIMPLEMENTED`, `UNAUTHENTICATED`, …) proves it did.
async fn accepted(channel: &Channel) -> Result<(), ConnectClientError> {
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let check = health.check(tonic_health::pb::HealthCheckRequest::default());
    match tokio::time::timeout(super::tls::HANDSHAKE_TIMEOUT, check).await {
        Ok(Err(status)) if std::error::Error::source(&status).is_some() => {
            Err(ConnectClientError::ClientCertificateRefused {
                detail: super::status::to_rpc_error(&status).message().to_owned(),
            })
        }
        // Answered, or slow: not a refusal this can tell.
        _ => Ok(()),
    }
}

/// A Spark Connect client over one HTTP/2 channel (plaintext, or TLS with
/// [`connect_tls`](Self::connect_tls)), sending
/// `authorization: Bearer <token>` on every RPC when a token is set (connect §4). Cheap to
/// clone: clones share the channel.
///
/// It implements [`ExecutionRpc`], so a
/// [`ReattachingStream`](crate::execution::client::ReattachingStream) runs over it with
/// Spark's retry policy; the other RPCs are plain methods. Status errors become
/// [`RpcError`]s carrying the Spark condition of the rich status (rx §1.8).
#[derive(Clone, Debug)]
pub struct ConnectClient {
    inner: SparkConnectServiceClient<InterceptedService<Channel, TokenSend>>,
    channel: Channel,
    metadata: TokenSend,
}

impl ConnectClient {
    /// Connects to `address` (e.g. `http://127.0.0.1:15002`, Spark Connect's default port
    /// 15002, rx §1.1).
    ///
    /// # Errors
    /// An invalid address or token, or a server that cannot be reached.
    pub async fn connect(address: &str, token: Option<&str>) -> Result<Self, ConnectClientError> {
        let channel = endpoint(address)?
            .connect()
            .await
            .map_err(ConnectClientError::Connect)?;
        Self::with_channel(channel, token)
    }

    /// Connects to `address` over TLS (e.g. `https://localhost:15002`; PySpark's
    /// `;use_ssl=true`, connect §7.1), verifying the server's certificate against the CAs of
    /// `tls` and presenting its client certificate, if any, to a server that requires one
    /// (mutual TLS). The token travels over the TLS channel.
    ///
    /// # Errors
    /// An invalid or non-`https` address, an invalid token, or a server that cannot be
    /// reached or whose TLS handshake fails ([`ConnectClientError::Connect`]). With a client
    /// certificate, a server that refuses it does so only after the client's side of the
    /// TLS 1.3 handshake is done; so one unary call (a `grpc.health.v1` check, whatever its
    /// answer) proves the connection accepted, and a connection the server ends instead is
    /// [`ConnectClientError::ClientCertificateRefused`] (not an RPC error a client would
    /// retry for minutes). A server that requires a certificate refuses a client without
    /// one at its first RPC: `UNAUTHENTICATED` from
    /// [`ServerTls::server_builder`](super::tls::ServerTls::server_builder).
    pub async fn connect_tls(
        address: &str,
        token: Option<&str>,
        tls: &super::tls::ClientTls,
    ) -> Result<Self, ConnectClientError> {
        let endpoint = endpoint(address)?;
        if endpoint.uri().scheme_str() != Some("https") {
            return Err(ConnectClientError::NotHttps {
                address: address.to_owned(),
            });
        }
        let channel = endpoint
            .tls_config(tls.to_config())
            .map_err(|source| ConnectClientError::Tls {
                address: address.to_owned(),
                source,
            })?
            .connect()
            .await
            .map_err(ConnectClientError::Connect)?;
        if tls.has_identity() {
            accepted(&channel).await?;
        }
        Self::with_channel(channel, token)
    }

    /// A client over an existing channel (one HTTP/2 connection for every RPC, as Spark's
    /// `SparkConnectClient` uses one channel, rx §1.1).
    ///
    /// # Errors
    /// A token that cannot travel in a header.
    pub fn with_channel(channel: Channel, token: Option<&str>) -> Result<Self, ConnectClientError> {
        let send = TokenSend::new(token).map_err(ConnectClientError::Token)?;
        Ok(Self::over(channel, send))
    }

    fn over(channel: Channel, metadata: TokenSend) -> Self {
        let inner = SparkConnectServiceClient::with_interceptor(channel.clone(), metadata.clone())
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
            .max_encoding_message_size(MAX_MESSAGE_SIZE);
        Self {
            inner,
            channel,
            metadata,
        }
    }

    /// This client (same channel), also sending `name: value` as metadata on every RPC,
    /// replacing an earlier value of `name`: what PySpark does with every extra `;key=value`
    /// of its connection string (connect §3), for example the session id a proxy routes on
    /// (`x-spark-connect-session-id`, docs/deployment.md §1).
    ///
    /// # Errors
    /// [`ConnectClientError::Header`]: a name that is not a lower-case ASCII header name, a
    /// `-bin` (binary) name, a reserved one (`authorization`: use the token; `grpc-…`,
    /// `content-type`, `te`, `user-agent`, `host`), a connection-specific one HTTP/2 forbids
    /// (`connection`, `keep-alive`, `proxy-connection`, `transfer-encoding`, `upgrade`), or
    /// a value that is empty, padded with spaces, or not printable ASCII (gRPC metadata).
    pub fn with_header(&self, name: &str, value: &str) -> Result<Self, ConnectClientError> {
        let refused = |reason: &'static str| ConnectClientError::Header {
            name: name.to_owned(),
            reason,
        };
        let reserved = ["authorization", "content-type", "te", "user-agent", "host"];
        if reserved.contains(&name) || name.starts_with("grpc-") {
            return Err(refused("reserved for the client itself"));
        }
        // Connection-specific headers are forbidden in HTTP/2 (RFC 9113 §8.2.2).
        let hop_by_hop = [
            "connection",
            "keep-alive",
            "proxy-connection",
            "transfer-encoding",
            "upgrade",
        ];
        if hop_by_hop.contains(&name) {
            return Err(refused("connection-specific, which HTTP/2 forbids"));
        }
        // gRPC metadata values are printable ASCII (space through `~`), and a header's
        // surrounding spaces are dropped on the way.
        if value.is_empty() || value.trim() != value {
            return Err(refused("an empty value, or one with surrounding spaces"));
        }
        if !value.bytes().all(|b| (b' '..=b'~').contains(&b)) {
            return Err(refused("its value holds characters a header cannot carry"));
        }
        if name.ends_with("-bin") {
            return Err(refused("a binary header; only ASCII values are sent"));
        }
        if name.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(refused("not lower case, as HTTP/2 header names must be"));
        }
        let key = tonic::metadata::AsciiMetadataKey::from_bytes(name.as_bytes())
            .map_err(|_| refused("not a valid header name"))?;
        let value = tonic::metadata::AsciiMetadataValue::try_from(value)
            .map_err(|_| refused("its value holds characters a header cannot carry"))?;
        Ok(Self::over(
            self.channel.clone(),
            self.metadata.with_extra(key, value),
        ))
    }

    /// `Config` (connect §1.1).
    ///
    /// # Errors
    /// The RPC failed.
    pub async fn config(&self, request: ConfigRequest) -> Result<ConfigResponse, RpcError> {
        let mut c = self.inner.clone();
        c.config(request)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| to_rpc_error(&s))
    }

    /// `AnalyzePlan` (connect §1.12).
    ///
    /// # Errors
    /// The RPC failed.
    pub async fn analyze_plan(
        &self,
        request: AnalyzePlanRequest,
    ) -> Result<AnalyzePlanResponse, RpcError> {
        let mut c = self.inner.clone();
        c.analyze_plan(request)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| to_rpc_error(&s))
    }

    /// `Interrupt` (rx §1.7).
    ///
    /// # Errors
    /// The RPC failed.
    pub async fn interrupt(
        &self,
        request: InterruptRequest,
    ) -> Result<InterruptResponse, RpcError> {
        let mut c = self.inner.clone();
        c.interrupt(request)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| to_rpc_error(&s))
    }

    /// `ReleaseSession` (rx §1.7).
    ///
    /// # Errors
    /// The RPC failed.
    pub async fn release_session(
        &self,
        request: ReleaseSessionRequest,
    ) -> Result<ReleaseSessionResponse, RpcError> {
        let mut c = self.inner.clone();
        c.release_session(request)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| to_rpc_error(&s))
    }
}

fn endpoint(address: &str) -> Result<Endpoint, ConnectClientError> {
    Endpoint::from_shared(address.to_owned()).map_err(|source| ConnectClientError::Address {
        address: address.to_owned(),
        source,
    })
}

type RpcStream = BoxStream<'static, Result<ExecutePlanResponse, RpcError>>;

fn rpc_stream(stream: tonic::Streaming<ExecutePlanResponse>) -> RpcStream {
    stream
        .map(|item| item.map_err(|s| to_rpc_error(&s)))
        .boxed()
}

impl ExecutionRpc for ConnectClient {
    type Stream = RpcStream;

    fn execute_plan(
        &self,
        request: ExecutePlanRequest,
    ) -> BoxFuture<'static, Result<RpcStream, RpcError>> {
        let mut c = self.inner.clone();
        Box::pin(async move {
            c.execute_plan(request)
                .await
                .map(|r| rpc_stream(r.into_inner()))
                .map_err(|s| to_rpc_error(&s))
        })
    }

    fn reattach_execute(
        &self,
        request: ReattachExecuteRequest,
    ) -> BoxFuture<'static, Result<RpcStream, RpcError>> {
        let mut c = self.inner.clone();
        Box::pin(async move {
            c.reattach_execute(request)
                .await
                .map(|r| rpc_stream(r.into_inner()))
                .map_err(|s| to_rpc_error(&s))
        })
    }

    fn release_execute(
        &self,
        request: ReleaseExecuteRequest,
    ) -> BoxFuture<'static, Result<ReleaseExecuteResponse, RpcError>> {
        let mut c = self.inner.clone();
        Box::pin(async move {
            c.release_execute(request)
                .await
                .map(tonic::Response::into_inner)
                .map_err(|s| to_rpc_error(&s))
        })
    }
}
