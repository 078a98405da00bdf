//! TLS and mutual TLS for Spark Connect (connect §7.1): the configuration of a
//! [`ConnectService`](super::ConnectService)'s server and of a
//! [`ConnectClient`](super::ConnectClient), read from PEM and checked when it is built, so
//! that a bad certificate or key is a [`TlsError`] at start-up, not a failed handshake later.
//!
//! Both wrap tonic's rustls configurations ([`ServerTlsConfig`], [`ClientTlsConfig`]) with
//! the `ring` crypto provider, which builds with a C compiler alone (no cmake, no Go, no
//! NASM). Spark 4.3.0's server has no TLS of its own; PySpark reaches a TLS server with
//! `sc://host:port/;use_ssl=true` (connect §7.1).
//!
//! A server: [`ConnectServer::tls`](super::ConnectServer::tls) serves it (the token,
//! connect §4, works over it unchanged), answering a plaintext client and (with mutual TLS)
//! a client without a certificate with an error it can read, not a broken connection. On
//! tonic's own server, [`ServerTls::server_builder`] and [`incoming`] do the same:
//!
//! ```no_run
//! # async fn serve(
//! #     service: tether::spark::connect::ConnectService<impl tether::spark::connect::QueryEngine>,
//! # ) -> Result<(), Box<dyn std::error::Error>> {
//! use tether::spark::connect::ConnectServer;
//! use tether::spark::connect::tls::ServerTls;
//!
//! // `.with_client_ca_pem(…)?` would require clients to present a certificate that CA
//! // signed (mutual TLS).
//! let tls = ServerTls::from_pem_files("server.pem".as_ref(), "server.key".as_ref(), None)?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:15002").await?;
//! let stop = async {
//!     let _ = tokio::signal::ctrl_c().await;
//! };
//! ConnectServer::new(service).tls(tls).token("s3cret").serve(listener, stop).await?;
//! # Ok(())
//! # }
//! ```
//!
//! And a client of it:
//!
//! ```no_run
//! # async fn client() -> Result<(), Box<dyn std::error::Error>> {
//! use tether::spark::connect::ConnectClient;
//! use tether::spark::connect::tls::ClientTls;
//!
//! let tls = ClientTls::from_ca_pem(std::fs::read("ca.pem")?)?;
//! let client = ConnectClient::connect_tls("https://localhost:15002", Some("s3cret"), &tls).await?;
//! # Ok(())
//! # }
//! ```

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// How long a server waits for a client's TLS handshake before it drops the connection
/// (tether's own bound; tonic waits forever by default, Spark has no TLS, connect §7.1).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a TLS configuration could not be built (connect §7.1): each names the file or PEM
/// it is about.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A PEM file could not be read.
    #[error("cannot read the {what} file {}", path.display())]
    Read {
        /// What the file should hold: `server certificate`, `client CA certificate`, …
        what: &'static str,
        /// The file as given.
        path: PathBuf,
        /// What reading it said.
        #[source]
        source: std::io::Error,
    },
    /// The PEM is malformed (a section without its end line, bad base64, …).
    #[error("the {what} is not valid PEM: {detail}")]
    Pem {
        /// What the PEM should hold.
        what: &'static str,
        /// What the PEM reader said.
        detail: String,
    },
    /// The PEM holds no `-----BEGIN CERTIFICATE-----` section.
    #[error("the {what} holds no PEM certificate (no `-----BEGIN CERTIFICATE-----` section)")]
    NoCertificate {
        /// What the PEM should hold.
        what: &'static str,
    },
    /// The PEM holds no private key (PKCS #8, PKCS #1 or SEC1).
    #[error(
        "the {what} holds no PEM private key (no `-----BEGIN PRIVATE KEY-----`, `RSA PRIVATE \
         KEY` or `EC PRIVATE KEY` section)"
    )]
    NoPrivateKey {
        /// What the PEM should hold.
        what: &'static str,
    },
    /// A certificate of a CA could not be used as a trust anchor.
    #[error("the {what} is not a usable CA certificate: {detail}")]
    BadCa {
        /// What the PEM should hold.
        what: &'static str,
        /// What rustls said.
        detail: String,
    },
    /// The private key does not belong to the certificate (its public key is not the
    /// certificate's).
    #[error("the {what} private key does not belong to its certificate")]
    KeyMismatch {
        /// Whose: `server` or `client`.
        what: &'static str,
    },
    /// The chain does not start with the certificate's own certificate: its first
    /// certificate is a CA's while a later one is not (a client takes the first as the
    /// server's or client's own and fails the handshake).
    #[error(
        "the {what} chain starts with a CA certificate: put the {what} first, then its \
         intermediates"
    )]
    ChainOrder {
        /// What the PEM should hold.
        what: &'static str,
    },
    /// A certificate of the chain is not valid now: expired or not yet valid (every peer
    /// would refuse the chain in the handshake). Times as the certificate states them.
    #[error(
        "{} is not valid now: valid from {not_before} until {not_after}",
        chain_member(what, *position)
    )]
    NotValidNow {
        /// What the PEM should hold.
        what: &'static str,
        /// Which certificate of the chain: 0 for the own certificate, then its
        /// intermediates in the order of the PEM.
        position: usize,
        /// Its `notBefore`.
        not_before: String,
        /// Its `notAfter`.
        not_after: String,
    },
    /// The private key is encrypted (`ENCRYPTED PRIVATE KEY`, or a PKCS #1 key with a
    /// `Proc-Type: 4,ENCRYPTED` header): tether, like tonic and rustls, reads unencrypted keys
    /// only.
    #[error(
        "the {what} is encrypted: decrypt it first (for example `openssl pkcs8 -in key.pem \
         -out key-plain.pem`, or `openssl rsa` for an RSA key) and keep the file readable by \
         the server only"
    )]
    EncryptedPrivateKey {
        /// What the PEM should hold.
        what: &'static str,
    },
    /// rustls refused the certificate and key together for another reason (for example a
    /// key type it does not support).
    #[error("the {what} was refused: {detail}")]
    Refused {
        /// The configuration: `server TLS configuration` or `client TLS configuration`.
        what: &'static str,
        /// What tonic and rustls said.
        detail: String,
    },
}

/// The TLS configuration of a Spark Connect server (connect §7.1): its certificate chain and
/// key, and optionally the CA whose certificates clients must present (mutual TLS). Serve
/// with [`server_builder`](Self::server_builder) and [`incoming`], which answer a client's
/// mistake in words it can read (plaintext, no client certificate), or apply
/// [`into_config`](Self::into_config) to a `tonic::transport::Server` yourself. The TLS
/// handshake must finish within [`HANDSHAKE_TIMEOUT`].
#[derive(Clone, Debug)]
pub struct ServerTls {
    identity: Identity,
    client_ca: Option<Certificate>,
    /// The PEM this was built from: the chain and key, and the client CA.
    pem: Arc<ServerPem>,
    /// rustls' configuration for [`ConnectServer`](super::ConnectServer), built (and so
    /// checked) with this.
    rustls: Arc<rustls::ServerConfig>,
}

/// The PEM of a [`ServerTls`].
#[derive(Debug)]
struct ServerPem {
    chain: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

impl ServerTls {
    /// A server presenting `cert_pem` (its certificate, then any intermediates) with the
    /// private key `key_pem` (connect §7.1).
    ///
    /// # Errors
    /// A PEM without a certificate or key, malformed PEM, or a key rustls refuses with the
    /// certificate (one that does not belong to it, an unsupported type).
    pub fn from_pem(
        cert_pem: impl AsRef<[u8]>,
        key_pem: impl AsRef<[u8]>,
    ) -> Result<Self, TlsError> {
        let (cert_pem, key_pem) = (cert_pem.as_ref(), key_pem.as_ref());
        own_chain(
            &certificates(cert_pem, "server certificate")?,
            "server certificate",
        )?;
        private_key(key_pem, "server private key")?;
        let pem = ServerPem {
            chain: cert_pem.to_vec(),
            key: key_pem.to_vec(),
            client_ca: None,
        };
        Self::checked(Identity::from_pem(cert_pem, key_pem), None, pem)
    }

    /// Requires every client to present a certificate signed by a CA of `ca_pem` (mutual
    /// TLS, connect §7.1). A certificate the CA did not sign fails the handshake. A client
    /// without a certificate is refused during the handshake with
    /// [`into_config`](Self::into_config); with [`server_builder`](Self::server_builder)
    /// it completes the handshake and its requests are answered `UNAUTHENTICATED`
    /// ([`NO_CLIENT_CERTIFICATE`]), except the `grpc.health.v1` health checks, so that
    /// probes need no certificate.
    ///
    /// # Errors
    /// A PEM without a certificate, malformed PEM, or a certificate that cannot be a trust
    /// anchor.
    pub fn with_client_ca_pem(self, ca_pem: impl AsRef<[u8]>) -> Result<Self, TlsError> {
        let ca_pem = ca_pem.as_ref();
        trust_anchors(ca_pem, "client CA certificate")?;
        let pem = ServerPem {
            chain: self.pem.chain.clone(),
            key: self.pem.key.clone(),
            client_ca: Some(ca_pem.to_vec()),
        };
        Self::checked(self.identity, Some(Certificate::from_pem(ca_pem)), pem)
    }

    /// [`from_pem`](Self::from_pem) and [`with_client_ca_pem`](Self::with_client_ca_pem)
    /// with the PEM read from files (the example server's `--tls-cert`, `--tls-key`,
    /// `--tls-client-ca`, connect §7.1).
    ///
    /// # Errors
    /// A file that cannot be read, or any error of those two.
    pub fn from_pem_files(
        cert: &Path,
        key: &Path,
        client_ca: Option<&Path>,
    ) -> Result<Self, TlsError> {
        let tls = Self::from_pem(
            read(cert, "server certificate")?,
            read(key, "server private key")?,
        )?;
        match client_ca {
            Some(ca) => tls.with_client_ca_pem(read(ca, "client CA certificate")?),
            None => Ok(tls),
        }
    }

    /// Whether clients must present a certificate (mutual TLS, connect §7.1).
    pub fn requires_client_certificate(&self) -> bool {
        self.client_ca.is_some()
    }

    /// tonic's configuration, for `tonic::transport::Server::tls_config` (connect §7.1). It
    /// was checked when this was built: `tls_config` accepts it. With mutual TLS, the
    /// handshake refuses a client without a certificate, which the client sees as a broken
    /// connection; [`server_builder`](Self::server_builder) tells it why instead.
    pub fn into_config(self) -> ServerTlsConfig {
        self.config(false)
    }

    /// `tonic::transport::Server::builder()` serving TLS with this configuration
    /// (connect §7.1). With mutual TLS, a client that presents no certificate completes the
    /// handshake, and each of its requests is answered `UNAUTHENTICATED` with
    /// [`NO_CLIENT_CERTIFICATE`] by the [`ClientCertificateCheck`] layer (a certificate the
    /// CA did not sign still fails the handshake); its `grpc.health.v1` checks are served,
    /// so that a load balancer's or an orchestrator's probe needs no certificate. Serve it on connections whose IO is a
    /// `TcpStream` (tonic's `TcpIncoming`, or [`incoming`]): the check finds a connection's
    /// certificates in tonic's `TlsConnectInfo<TcpConnectInfo>`, and refuses every request
    /// of any other connection.
    pub fn server_builder(
        self,
    ) -> tonic::transport::Server<
        tower::layer::util::Stack<ClientCertificateCheck, tower::layer::util::Identity>,
    > {
        let check = ClientCertificateCheck {
            required: self.requires_client_certificate(),
        };
        tonic::transport::Server::builder()
            .tls_config(self.config(true))
            .expect("checked when the ServerTls was built")
            .layer(check)
    }

    /// tonic's configuration; `optional`: a client may present no certificate (then
    /// [`ClientCertificateCheck`] refuses its requests).
    fn config(self, optional: bool) -> ServerTlsConfig {
        let config = ServerTlsConfig::new()
            .identity(self.identity)
            .timeout(HANDSHAKE_TIMEOUT);
        match self.client_ca {
            Some(ca) => config.client_ca_root(ca).client_auth_optional(optional),
            None => config,
        }
    }

    /// This configuration, once the acceptors tonic builds from it and rustls' own
    /// configuration were built, so that what rustls refuses is refused now.
    fn checked(
        identity: Identity,
        client_ca: Option<Certificate>,
        pem: ServerPem,
    ) -> Result<Self, TlsError> {
        install_default_provider();
        let rustls = Arc::new(rustls_server_config(&pem)?);
        let tls = Self {
            identity,
            client_ca,
            pem: Arc::new(pem),
            rustls,
        };
        for optional in [false, true] {
            tonic::transport::Server::builder()
                .tls_config(tls.clone().config(optional))
                .map_err(|e| refused(&e, "server"))?;
        }
        Ok(tls)
    }

    /// rustls' configuration, as [`ConnectServer`](super::ConnectServer) serves it: ALPN
    /// `h2`; with a client CA, a client certificate is optional in the handshake (one the
    /// CA did not sign fails it) and [`ClientCertificateCheck`] refuses the requests of a
    /// connection without one.
    pub(super) fn rustls_config(&self) -> Arc<rustls::ServerConfig> {
        self.rustls.clone()
    }
}

/// rustls' server configuration of `pem` (connect §7.1).
fn rustls_server_config(pem: &ServerPem) -> Result<rustls::ServerConfig, TlsError> {
    let chain = certificates(&pem.chain, "server certificate")?;
    let key = private_key(&pem.key, "server private key")?;
    let builder = rustls::ServerConfig::builder();
    let builder = match &pem.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let what = "client CA certificate";
            let roots = trust_anchors(ca, what)?;
            let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
                .allow_unauthenticated()
                .build()
                .map_err(|e| TlsError::BadCa {
                    what,
                    detail: e.to_string(),
                })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|e| match e {
        rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => {
            TlsError::KeyMismatch { what: "server" }
        }
        e => TlsError::Refused {
            what: "server TLS configuration",
            detail: e.to_string(),
        },
    })?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// The path prefix of the standard gRPC health service's methods (`grpc.health.v1.Health`,
/// connect §7.2), which [`ClientCertificateCheck`] serves without a client certificate.
pub const HEALTH_PATH: &str = "/grpc.health.v1.Health/";

/// What a client without a certificate is told by a server that requires one
/// (connect §7.1).
pub const NO_CLIENT_CERTIFICATE: &str = "this Spark Connect server requires a client \
                                         certificate (mutual TLS), and the connection \
                                         presented none";

/// The tower layer of [`ServerTls::server_builder`] (connect §7.1): when the server
/// requires a client certificate, every request of a TLS connection that presented none
/// is answered `UNAUTHENTICATED` with [`NO_CLIENT_CERTIFICATE`], before any service sees
/// it, except those of the standard health service ([`HEALTH_PATH`]): probes carry no
/// certificate, and health tells nothing about the data.
/// Its `Default` requires nothing (for a plaintext server of the same type).
#[derive(Clone, Copy, Debug, Default)]
pub struct ClientCertificateCheck {
    required: bool,
}

impl ClientCertificateCheck {
    /// The check, refusing requests without a client certificate when `required`.
    pub(super) fn new(required: bool) -> Self {
        Self { required }
    }
}

/// What [`ConnectServer`](super::ConnectServer) knows of a connection, in each request's
/// extensions (tonic's own server puts its `TlsConnectInfo` there instead).
#[derive(Clone, Debug)]
pub(super) struct TlsPeer {
    /// The client's address.
    pub(super) remote: Option<std::net::SocketAddr>,
    /// The server's address.
    pub(super) local: Option<std::net::SocketAddr>,
    /// Whether the client presented a certificate in the TLS handshake.
    pub(super) certificates: bool,
}

impl<S> tower::Layer<S> for ClientCertificateCheck {
    type Service = ClientCertificateService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ClientCertificateService {
            inner,
            required: self.required,
        }
    }
}

/// The service [`ClientCertificateCheck`] wraps around a server's services (connect §7.1).
#[derive(Clone, Debug)]
pub struct ClientCertificateService<S> {
    inner: S,
    required: bool,
}

impl<S, B, R> tower::Service<http::Request<B>> for ClientCertificateService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    R: Default,
{
    type Response = http::Response<R>;
    type Error = S::Error;
    type Future =
        futures::future::Either<std::future::Ready<Result<http::Response<R>, S::Error>>, S::Future>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
        let presented = || {
            request
                .extensions()
                .get::<TlsConnectInfo<TcpConnectInfo>>()
                .and_then(TlsConnectInfo::peer_certs)
                .is_some_and(|certs| !certs.is_empty())
                || request
                    .extensions()
                    .get::<TlsPeer>()
                    .is_some_and(|peer| peer.certificates)
        };
        if self.required && !request.uri().path().starts_with(HEALTH_PATH) && !presented() {
            let peer = request
                .extensions()
                .get::<TlsConnectInfo<TcpConnectInfo>>()
                .and_then(|info| info.get_ref().remote_addr())
                .or_else(|| request.extensions().get::<TlsPeer>()?.remote)
                .map(|a| a.to_string());
            tracing::warn!(
                peer = peer.as_deref().unwrap_or("unknown"),
                why = NO_CLIENT_CERTIFICATE,
                "Spark Connect request refused"
            );
            let refusal = tonic::Status::unauthenticated(NO_CLIENT_CERTIFICATE).into_http();
            return futures::future::Either::Left(std::future::ready(Ok(refusal)));
        }
        futures::future::Either::Right(self.inner.call(request))
    }
}

/// The TLS configuration of a Spark Connect client (connect §7.1): the CA certificates the
/// server's certificate must chain to, and optionally the client's own certificate and key
/// for a server that requires one (mutual TLS). Used by
/// [`ConnectClient::connect_tls`](super::ConnectClient::connect_tls).
///
/// Only the given CAs are trusted, never the system's: a Spark Connect deployment usually
/// has a CA of its own.
#[derive(Clone, Debug)]
pub struct ClientTls {
    ca: Certificate,
    identity: Option<Identity>,
    domain: Option<String>,
}

impl ClientTls {
    /// A client trusting the CA certificates of `ca_pem` (PySpark's
    /// `GRPC_DEFAULT_SSL_ROOTS_FILE_PATH`, connect §7.1).
    ///
    /// # Errors
    /// A PEM without a certificate, malformed PEM, or a certificate that cannot be a trust
    /// anchor.
    pub fn from_ca_pem(ca_pem: impl AsRef<[u8]>) -> Result<Self, TlsError> {
        let ca_pem = ca_pem.as_ref();
        trust_anchors(ca_pem, "CA certificate")?;
        Ok(Self {
            ca: Certificate::from_pem(ca_pem),
            identity: None,
            domain: None,
        })
    }

    /// Presents `cert_pem` with the private key `key_pem` to the server (mutual TLS,
    /// connect §7.1).
    ///
    /// # Errors
    /// A PEM without a certificate or key, malformed PEM, or a key rustls refuses with the
    /// certificate.
    pub fn with_identity_pem(
        self,
        cert_pem: impl AsRef<[u8]>,
        key_pem: impl AsRef<[u8]>,
    ) -> Result<Self, TlsError> {
        let (cert_pem, key_pem) = (cert_pem.as_ref(), key_pem.as_ref());
        own_chain(
            &certificates(cert_pem, "client certificate")?,
            "client certificate",
        )?;
        private_key(key_pem, "client private key")?;
        let tls = Self {
            identity: Some(Identity::from_pem(cert_pem, key_pem)),
            ..self
        };
        tls.check()?;
        Ok(tls)
    }

    /// [`from_ca_pem`](Self::from_ca_pem) and [`with_identity_pem`](Self::with_identity_pem)
    /// with the PEM read from files (`examples/connect_client.rs`'s `--tls-ca`,
    /// `--tls-cert`, `--tls-key`, connect §7.1); `identity` is the certificate and key.
    ///
    /// # Errors
    /// A file that cannot be read, or any error of those two.
    pub fn from_pem_files(ca: &Path, identity: Option<(&Path, &Path)>) -> Result<Self, TlsError> {
        let tls = Self::from_ca_pem(read(ca, "CA certificate")?)?;
        match identity {
            Some((cert, key)) => tls.with_identity_pem(
                read(cert, "client certificate")?,
                read(key, "client private key")?,
            ),
            None => Ok(tls),
        }
    }

    /// Checks the server's certificate against `name` instead of the address's host, for
    /// example when connecting by IP address to a certificate that names a host
    /// (connect §7.1).
    pub fn with_domain_name(self, name: impl Into<String>) -> Self {
        Self {
            domain: Some(name.into()),
            ..self
        }
    }

    /// Whether the client presents a certificate (mutual TLS, connect §7.1).
    pub fn has_identity(&self) -> bool {
        self.identity.is_some()
    }

    /// tonic's configuration, for `tonic::transport::Endpoint::tls_config` (connect §7.1).
    pub fn to_config(&self) -> ClientTlsConfig {
        let mut config = ClientTlsConfig::new().ca_certificate(self.ca.clone());
        if let Some(identity) = &self.identity {
            config = config.identity(identity.clone());
        }
        if let Some(domain) = &self.domain {
            config = config.domain_name(domain.clone());
        }
        config
    }

    /// Builds the connector tonic builds from this configuration, so that what rustls
    /// refuses is refused now.
    fn check(&self) -> Result<(), TlsError> {
        tonic::transport::Endpoint::from_static("https://localhost")
            .tls_config(self.to_config())
            .map(drop)
            .map_err(|e| refused(&e, "client"))
    }
}

/// What a plaintext client is told on a TLS port (connect §7.1).
pub const PLAINTEXT_REFUSAL: &str = "this Spark Connect server serves TLS only: connect with \
                                     https:// (PySpark: sc://HOST:PORT/;use_ssl=true)";

/// The connections `listener` accepts, for a TLS server's
/// `tonic::transport::Server::serve_with_incoming` (connect §7.1), `TCP_NODELAY` on. A client
/// that starts in plaintext HTTP instead of with a TLS handshake never reaches the TLS
/// acceptor (which would answer with a TLS alert the client reads as a garbled frame): its
/// requests are answered in plaintext, a gRPC request with `FAILED_PRECONDITION` and
/// [`PLAINTEXT_REFUSAL`] (not `UNAVAILABLE`: retrying cannot help), an HTTP/1 request with
/// `400` and the same text. A connection that sends nothing within [`HANDSHAKE_TIMEOUT`]
/// is dropped.
///
/// Each connection is looked at on a task of its own: a slow one delays no other. Each is
/// an [`AcceptedStream`], which closes gracefully, so that a client whose certificate the
/// handshake refused reads the TLS alert instead of a reset connection.
pub fn incoming(
    listener: tokio::net::TcpListener,
) -> impl futures::Stream<Item = std::io::Result<AcceptedStream>> + Send + 'static {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = tx.closed() => return,
            };
            match accepted {
                Ok((stream, _)) => {
                    let tx = tx.clone();
                    tokio::spawn(async move {
                        if let Some(stream) = sniff(stream).await {
                            let _ = tx.send(Ok(AcceptedStream::new(stream))).await;
                        }
                    });
                }
                Err(e) => {
                    if tx.send(Err(e)).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    futures::stream::unfold(rx, |mut rx| async move {
        let item = rx.recv().await?;
        Some((item, rx))
    })
}

/// How long a closing [`AcceptedStream`] reads (and drops) what its peer still sends.
const LINGER: Duration = Duration::from_secs(1);

/// A TCP connection [`incoming`] accepted (connect §7.1): a `TcpStream` that, when the
/// server drops it, closes gracefully (a "lingering close", as web servers do): it sends its
/// FIN, then reads and drops what the peer still sends, for at most 1 s, before it closes
/// the socket. Closing a socket with unread data makes the kernel reset the connection,
/// and a reset can overtake the TLS alert just sent: a client whose certificate the
/// handshake refused (mutual TLS) would see a broken connection, which clients retry for
/// minutes, instead of the alert that says why. The close runs on the runtime the stream
/// is dropped in (without one, the socket is closed at once).
#[derive(Debug)]
pub struct AcceptedStream {
    /// `Some` until dropped.
    stream: Option<tokio::net::TcpStream>,
}

impl AcceptedStream {
    /// `stream`, closed gracefully when dropped (for connections accepted some other way,
    /// such as a plaintext server's; connect §7.1).
    pub fn new(stream: tokio::net::TcpStream) -> Self {
        Self {
            stream: Some(stream),
        }
    }

    /// The TCP connection (connect §7.1).
    pub fn get_ref(&self) -> &tokio::net::TcpStream {
        self.stream.as_ref().expect("present until dropped")
    }

    fn io(&mut self) -> Pin<&mut tokio::net::TcpStream> {
        Pin::new(self.stream.as_mut().expect("present until dropped"))
    }
}

impl Drop for AcceptedStream {
    fn drop(&mut self) {
        let Some(mut stream) = self.stream.take() else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let _ = stream.shutdown().await;
                let mut sink = [0u8; 4096];
                let _ = tokio::time::timeout(LINGER, async {
                    while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
                })
                .await;
            });
        }
    }
}

impl tonic::transport::server::Connected for AcceptedStream {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.get_ref().connect_info()
    }
}

impl tokio::io::AsyncRead for AcceptedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.io().poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for AcceptedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.io().poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.io().poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.get_ref().is_write_vectored()
    }

    fn poll_flush(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.io().poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.io().poll_shutdown(cx)
    }
}

/// `stream` when it starts like a TLS handshake (or like nothing this knows); `None` when
/// it was a plaintext HTTP client, answered and closed here, or silent.
async fn sniff(stream: tokio::net::TcpStream) -> Option<tokio::net::TcpStream> {
    let _ = stream.set_nodelay(true);
    let mut first = [0u8; 1];
    let peeked = tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.peek(&mut first)).await;
    match peeked {
        Ok(Ok(1)) => {}
        _ => return None,
    }
    // A TLS connection opens with a handshake record (type 22); HTTP with an upper-case
    // method (`PRI * HTTP/2.0` for HTTP/2, `GET`, `POST`, … for HTTP/1).
    if !first[0].is_ascii_uppercase() {
        return Some(stream);
    }
    let refuse = hyper::service::service_fn(|request: http::Request<hyper::body::Incoming>| {
        let response = if request.version() == http::Version::HTTP_2 {
            tonic::Status::failed_precondition(PLAINTEXT_REFUSAL).into_http()
        } else {
            let mut response =
                http::Response::new(tonic::body::Body::new(format!("{PLAINTEXT_REFUSAL}\n")));
            *response.status_mut() = http::StatusCode::BAD_REQUEST;
            response
        };
        std::future::ready(Ok::<_, std::convert::Infallible>(response))
    });
    let builder =
        hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
    let connection = builder.serve_connection(hyper_util::rt::TokioIo::new(stream), refuse);
    let _ = tokio::time::timeout(HANDSHAKE_TIMEOUT, connection).await;
    None
}

/// tonic builds its rustls server configurations with the process's default crypto
/// provider; when the process has none (and the dependency graph enables more than one, so
/// rustls cannot pick), rustls would panic there. `ring`'s becomes the default then.
fn install_default_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread may have installed one meanwhile: then that one stays. rustls
        // 0.23.48 deprecates ring's provider for its lack of post-quantum key exchange; ring
        // is the provider tonic's `tls-ring` serves with, and a process that wants another
        // (aws-lc-rs, with post-quantum key exchange) installs it before this runs.
        #[allow(deprecated, reason = "ring is tonic's tls-ring provider; see above")]
        let provider = rustls::crypto::ring::default_provider();
        let _ = provider.install_default();
    }
}

fn read(path: &Path, what: &'static str) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_owned(),
        source,
    })
}

fn certificates(pem: &[u8], what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(what, &e))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate { what });
    }
    Ok(certs)
}

/// A peer's own chain, checked as the other side will check it (connect §7.1): its first
/// certificate is its own, not a CA's ahead of a leaf (a lone CA certificate is warned
/// about), and every certificate is valid now. (Whether it chains to a CA the other
/// side trusts only the other side can tell.)
fn own_chain(certs: &[CertificateDer<'_>], what: &'static str) -> Result<(), TlsError> {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let mut parsed = Vec::with_capacity(certs.len());
    for cert in certs {
        let (_, x509) = X509Certificate::from_der(cert).map_err(|e| TlsError::Pem {
            what,
            detail: format!("a certificate is not valid DER: {e}"),
        })?;
        parsed.push(x509);
    }
    let is_ca = |c: &X509Certificate<'_>| {
        c.basic_constraints()
            .ok()
            .flatten()
            .is_some_and(|b| b.value.ca)
    };
    if let Some((first, rest)) = parsed.split_first() {
        if is_ca(first) && rest.iter().any(|c| !is_ca(c)) {
            return Err(TlsError::ChainOrder { what });
        }
        if is_ca(first) {
            // OpenSSL's `req -x509` marks a self-signed certificate CA:TRUE by default.
            tracing::warn!(
                certificate = what,
                "the {what} is a CA certificate (basicConstraints CA:TRUE) used as its own: \
                 OpenSSL-based peers (PySpark's grpc-core, the JVM) accept it, rustls/webpki \
                 peers (tether's own ConnectClient among them) refuse it (CaUsedAsEndEntity); \
                 issue a certificate with CA:FALSE signed by that CA"
            );
        }
    }
    for (position, cert) in parsed.iter().enumerate() {
        let validity = cert.validity();
        if !validity.is_valid() {
            return Err(TlsError::NotValidNow {
                what,
                position,
                not_before: validity.not_before.to_string(),
                not_after: validity.not_after.to_string(),
            });
        }
    }
    Ok(())
}

fn private_key(pem: &[u8], what: &'static str) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| {
        let text = String::from_utf8_lossy(pem);
        if text.contains("-----BEGIN ENCRYPTED PRIVATE KEY-----")
            || text.contains("Proc-Type: 4,ENCRYPTED")
        {
            return TlsError::EncryptedPrivateKey { what };
        }
        match e {
            rustls::pki_types::pem::Error::NoItemsFound => TlsError::NoPrivateKey { what },
            e => pem_error(what, &e),
        }
    })
}

/// The certificate of a chain at `position`, in words (0 is the chain's own certificate).
fn chain_member(what: &str, position: usize) -> String {
    match position {
        0 => format!("the {what}"),
        n => format!(
            "certificate {} of the {what} chain (an intermediate)",
            n + 1
        ),
    }
}

/// Every certificate of `pem` as a trust anchor (tonic skips the ones it cannot parse, which
/// would only show as a failed handshake).
fn trust_anchors(pem: &[u8], what: &'static str) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in certificates(pem, what)? {
        roots.add(cert).map_err(|e| TlsError::BadCa {
            what,
            detail: e.to_string(),
        })?;
    }
    Ok(roots)
}

/// What tonic's refusal of the `side`'s configuration means.
fn refused(e: &tonic::transport::Error, side: &'static str) -> TlsError {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(cause) = next {
        if let Some(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) =
            cause.downcast_ref::<rustls::Error>()
        {
            return TlsError::KeyMismatch { what: side };
        }
        next = cause.source();
    }
    TlsError::Refused {
        what: if side == "server" {
            "server TLS configuration"
        } else {
            "client TLS configuration"
        },
        detail: std::error::Error::source(e).map_or_else(|| e.to_string(), super::error_chain),
    }
}

/// A PEM reader's error in words (its own names the markers' bytes as numbers).
fn pem_error(what: &'static str, e: &rustls::pki_types::pem::Error) -> TlsError {
    use rustls::pki_types::pem::Error;
    let detail = match e {
        Error::MissingSectionEnd { end_marker } => format!(
            "a section has no end line `{}`",
            String::from_utf8_lossy(end_marker)
        ),
        Error::IllegalSectionStart { line } => format!(
            "malformed section start line `{}`",
            String::from_utf8_lossy(line)
        ),
        e => e.to_string(),
    };
    TlsError::Pem { what, detail }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Pki {
        ca: String,
        cert: String,
        key: String,
        other_key: String,
    }

    fn pki() -> Pki {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        Pki {
            ca: ca_cert.pem(),
            cert: cert.pem(),
            key: key.serialize_pem(),
            other_key: rcgen::KeyPair::generate().unwrap().serialize_pem(),
        }
    }

    fn message(r: Result<impl std::fmt::Debug, TlsError>) -> String {
        r.unwrap_err().to_string()
    }

    #[test]
    fn good_pem_builds_both_sides() {
        let p = pki();
        let server = ServerTls::from_pem(&p.cert, &p.key).unwrap();
        assert!(!server.requires_client_certificate());
        let server = server.with_client_ca_pem(&p.ca).unwrap();
        assert!(server.requires_client_certificate());
        let _ = server.into_config();
        let client = ClientTls::from_ca_pem(&p.ca).unwrap();
        assert!(!client.has_identity());
        let client = client.with_identity_pem(&p.cert, &p.key).unwrap();
        assert!(client.has_identity());
        let _ = client.with_domain_name("localhost").to_config();
    }

    #[test]
    fn a_chain_out_of_order_or_of_its_time_is_a_clear_error() {
        let p = pki();
        // The CA first, then the server's certificate.
        let reversed = format!("{}{}", p.ca, p.cert);
        assert_eq!(
            message(ServerTls::from_pem(&reversed, &p.key)),
            "the server certificate chain starts with a CA certificate: put the server \
             certificate first, then its intermediates"
        );
        // The right order with the intermediate after it is fine.
        let chain = format!("{}{}", p.cert, p.ca);
        assert!(ServerTls::from_pem(&chain, &p.key).is_ok());
        // Expired, and not yet valid.
        for (from, until) in [((2000, 1, 1), (2001, 1, 1)), ((2999, 1, 1), (3000, 1, 1))] {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
            params.not_before = rcgen::date_time_ymd(from.0, from.1, from.2);
            params.not_after = rcgen::date_time_ymd(until.0, until.1, until.2);
            let cert = params.self_signed(&key).unwrap();
            let e = message(ServerTls::from_pem(cert.pem(), key.serialize_pem()));
            assert!(
                e.starts_with("the server certificate is not valid now: valid from ")
                    && e.contains(&until.0.to_string()),
                "{e}"
            );
            let e = message(
                ClientTls::from_ca_pem(&p.ca)
                    .unwrap()
                    .with_identity_pem(cert.pem(), key.serialize_pem()),
            );
            assert!(
                e.starts_with("the client certificate is not valid now"),
                "{e}"
            );
        }
        // A valid leaf after which comes an expired intermediate.
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.not_before = rcgen::date_time_ymd(2000, 1, 1);
        ca.not_after = rcgen::date_time_ymd(2001, 1, 1);
        let expired_ca = ca.self_signed(&ca_key).unwrap();
        let chain = format!("{}{}", p.cert, expired_ca.pem());
        let e = message(ServerTls::from_pem(&chain, &p.key));
        assert!(
            e.starts_with(
                "certificate 2 of the server certificate chain (an intermediate) is not valid \
                 now: valid from "
            ),
            "{e}"
        );
    }

    #[test]
    fn an_encrypted_private_key_is_named_as_such() {
        let p = pki();
        // The shape of `openssl pkcs8 -topk8 -v2 aes-256-cbc` output, and of a legacy
        // encrypted PKCS #1 key: the body is never read.
        let pkcs8 = "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIFHzBJBgkqhkiG9w0BBQ0wPDAb\n\
                     -----END ENCRYPTED PRIVATE KEY-----\n";
        let pkcs1 = "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\n\
                     DEK-Info: AES-256-CBC,0123456789ABCDEF0123456789ABCDEF\n\nAAAA\n\
                     -----END RSA PRIVATE KEY-----\n";
        for key in [pkcs8, pkcs1] {
            let e = message(ServerTls::from_pem(&p.cert, key));
            assert!(
                e.starts_with("the server private key is encrypted: decrypt it first"),
                "{e}"
            );
            let e = message(
                ClientTls::from_ca_pem(&p.ca)
                    .unwrap()
                    .with_identity_pem(&p.cert, key),
            );
            assert!(e.starts_with("the client private key is encrypted"), "{e}");
        }
    }

    #[test]
    fn bad_pem_is_a_clear_error() {
        let p = pki();
        assert_eq!(
            message(ServerTls::from_pem(&p.key, &p.key)),
            "the server certificate holds no PEM certificate (no `-----BEGIN CERTIFICATE-----` \
             section)"
        );
        let e = message(ServerTls::from_pem(&p.cert, &p.cert));
        assert!(
            e.starts_with("the server private key holds no PEM private key"),
            "{e}"
        );
        let truncated = &p.cert[..p.cert.len() / 2];
        assert_eq!(
            message(ServerTls::from_pem(truncated, &p.key)),
            "the server certificate is not valid PEM: a section has no end line `CERTIFICATE`"
        );
        assert_eq!(
            message(ServerTls::from_pem(&p.cert, &p.other_key)),
            "the server private key does not belong to its certificate"
        );
        let e = message(ClientTls::from_ca_pem("not a certificate"));
        assert!(
            e.starts_with("the CA certificate holds no PEM certificate"),
            "{e}"
        );
        let garbage = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let e = message(ClientTls::from_ca_pem(garbage));
        assert!(
            e.starts_with("the CA certificate is not a usable CA certificate: "),
            "{e}"
        );
        let e = message(
            ServerTls::from_pem(&p.cert, &p.key)
                .unwrap()
                .with_client_ca_pem(""),
        );
        assert!(
            e.starts_with("the client CA certificate holds no PEM certificate"),
            "{e}"
        );
        let client = ClientTls::from_ca_pem(&p.ca).unwrap();
        assert_eq!(
            message(client.with_identity_pem(&p.cert, &p.other_key)),
            "the client private key does not belong to its certificate"
        );
        let missing = Path::new("/nonexistent/tether-server.pem");
        let e = message(ServerTls::from_pem_files(missing, missing, None));
        assert!(
            e.starts_with("cannot read the server certificate file /nonexistent/tether-server.pem"),
            "{e}"
        );
    }
}
