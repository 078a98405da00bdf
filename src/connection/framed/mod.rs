//! Length-delimited frames over any `AsyncRead + AsyncWrite` (Unix sockets, TCP), as a
//! [`Connection`]. Available with the `tokio` feature.
//!
//! Each message travels as one frame of [`FrameCodec`]: a 4-byte
//! big-endian length, then the protobuf body. It is tether's lightweight alternative to gRPC
//! (Spark's transport: one HTTP/2 channel per worker over its Unix socket, one `Execute` call
//! per session, udf §1.1, §6.4): one socket connection per session, no HTTP/2.
//!
//! Robustness against a hostile or broken peer:
//! - a length prefix above [`FramedConfig::max_frame_len`] is a typed error at once, and the
//!   claimed length is never allocated;
//! - a peer that closes mid-frame gives [`FramedError::Frame`] (`Truncated`);
//! - a frame that has started must complete within [`FramedConfig::frame_timeout`] (30 s by
//!   default), so a peer trickling bytes cannot hold a session forever.

use std::fmt;
use std::io;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio_util::codec::{Decoder, Encoder};

mod read;
mod write;

use read::ReadBuffer;
use write::WriteQueue;

use super::{Connection, ConnectionError};
use crate::wire::{DEFAULT_MAX_FRAME_LEN, FrameCodec, FrameError};

/// Settings of a framed connection: tether's own transport, where Spark configures a gRPC
/// channel (udf §6.4).
#[derive(Debug, Clone)]
pub struct FramedConfig {
    /// Largest accepted frame body in bytes (default 128 MiB, Spark's gRPC max inbound message
    /// size, udf §6.4, §7).
    pub max_frame_len: usize,
    /// Initial read buffer capacity in bytes (default 64 KiB). tether's own: gRPC sizes its
    /// buffers itself (udf §6.4).
    pub read_buffer: usize,
    /// Bytes buffered for writing before `poll_ready` waits for the socket (default 64 KiB):
    /// the backpressure HTTP/2 flow control gives a gRPC stream (udf §1.4).
    pub write_buffer: usize,
    /// Longest time a started frame may take to arrive completely (default 30 s, as the
    /// session timeouts of udf §7). tether's own guard against a peer trickling bytes.
    pub frame_timeout: Duration,
}

impl Default for FramedConfig {
    fn default() -> Self {
        Self {
            max_frame_len: DEFAULT_MAX_FRAME_LEN,
            read_buffer: 64 * 1024,
            write_buffer: 64 * 1024,
            frame_timeout: Duration::from_secs(30),
        }
    }
}

/// Errors of a framed connection. Converted into [`ConnectionError::Transport`] when seen
/// through the [`Connection`] trait (the original stays reachable as the source), so an
/// engine session settles `TransportFailed` on any of them (udf §4.5).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FramedError {
    /// Socket I/O failed (the `io::Error` is the source).
    #[error("I/O error")]
    Io(#[from] io::Error),
    /// A frame was oversize, truncated by the peer closing, or undecodable.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// A started frame did not complete in time.
    #[error("frame started but not completed within {0:?}")]
    FrameTimeout(Duration),
}

impl From<FramedError> for ConnectionError {
    fn from(e: FramedError) -> Self {
        Self::transport(e)
    }
}

/// The tokio-util codec: messages of type `Out` encoded, `In` decoded, one per
/// [`FrameCodec`] frame (tether's framing of the udf §1.2 envelopes, where Spark uses gRPC's).
#[derive(Debug)]
pub struct MessageCodec<Out, In> {
    codec: FrameCodec,
    _types: PhantomData<fn(Out) -> In>,
}

impl<Out, In> MessageCodec<Out, In> {
    /// A codec with the given maximum frame body length in bytes (Spark's gRPC limit is
    /// 128 MiB, udf §6.4).
    pub fn new(max_frame_len: usize) -> Self {
        Self {
            codec: FrameCodec::new(max_frame_len),
            _types: PhantomData,
        }
    }
}

impl<Out, In: prost::Message + Default> Decoder for MessageCodec<Out, In> {
    type Item = In;
    type Error = FramedError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<In>, FramedError> {
        Ok(self.codec.decode(src)?)
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<In>, FramedError> {
        Ok(self.codec.decode_eof(src)?)
    }
}

impl<Out: prost::Message, In> Encoder<Out> for MessageCodec<Out, In> {
    type Error = FramedError;

    fn encode(&mut self, item: Out, dst: &mut BytesMut) -> Result<(), FramedError> {
        Ok(self.codec.encode(&item, dst)?)
    }
}

/// A [`Connection`] over a byte stream `T`, sending `Out` and receiving `In` as
/// length-delimited frames: one `Execute` stream (udf §1.1) per socket connection;
/// [`poll_close`](Connection::poll_close) shuts the write half (the half-close of udf §2 R9).
///
/// A data batch (udf §1.4) is written by reference: its frame goes out as the encoded head
/// and the batch's own `Bytes` in one vectored write, never copied (streams that do not take
/// vectored writes get one slice per write). A received body lands in place in a buffer
/// sized from its length prefix (at most 1 MiB up front, then doubling as bytes arrive), and
/// decoded batches share that buffer.
pub struct FramedConnection<T, Out, In> {
    io: T,
    codec: FrameCodec,
    read: ReadBuffer,
    write: WriteQueue,
    write_buffer: usize,
    frame_timeout: Duration,
    frame_deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    recv_ended: bool,
    send_closed: bool,
    _types: PhantomData<fn(Out) -> In>,
}

impl<T, Out, In> std::fmt::Debug for FramedConnection<T, Out, In> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FramedConnection")
            .field("recv_ended", &self.recv_ended)
            .field("send_closed", &self.send_closed)
            .finish_non_exhaustive()
    }
}

impl<T, Out, In> FramedConnection<T, Out, In>
where
    T: AsyncRead + AsyncWrite,
{
    /// Wraps an established byte stream: one session's connection (udf §1.1).
    pub fn new(io: T, config: &FramedConfig) -> Self {
        Self {
            io,
            codec: FrameCodec::new(config.max_frame_len),
            read: ReadBuffer::with_capacity(config.read_buffer),
            write: WriteQueue::default(),
            write_buffer: config.write_buffer.max(1),
            frame_timeout: config.frame_timeout,
            frame_deadline: None,
            recv_ended: false,
            send_closed: false,
            _types: PhantomData,
        }
    }

    /// The underlying byte stream (a socket of udf §1.9's `WorkerConnectionSpec` kinds).
    pub fn get_ref(&self) -> &T {
        &self.io
    }
}

impl<T, Out, In> FramedConnection<T, Out, In>
where
    T: AsyncWrite + Unpin,
{
    /// Writes every queued frame, then flushes the stream.
    fn poll_flush_io(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), FramedError>> {
        ready!(self.write.poll_write_all(Pin::new(&mut self.io), cx))?;
        ready!(Pin::new(&mut self.io).poll_flush(cx))?;
        Poll::Ready(Ok(()))
    }
}

impl<T, Out, In> Connection<Out, In> for FramedConnection<T, Out, In>
where
    T: AsyncRead + AsyncWrite + Unpin,
    Out: prost::Message + 'static,
    In: prost::Message + Default,
{
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnectionError>> {
        // The write buffer bound: past it, everything queued goes out before more is taken.
        if self.write.queued() >= self.write_buffer {
            return self.poll_flush_io(cx).map_err(Into::into);
        }
        Poll::Ready(Ok(()))
    }

    fn start_send(&mut self, msg: Out) -> Result<(), ConnectionError> {
        self.write
            .push(&self.codec, &msg)
            .map_err(|e| FramedError::from(e).into())
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnectionError>> {
        self.poll_flush_io(cx).map_err(Into::into)
    }

    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnectionError>> {
        let r = match self.poll_flush_io(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut self.io)
                .poll_shutdown(cx)
                .map_err(|e| FramedError::from(e).into()),
            other => other.map_err(Into::into),
        };
        if r.is_ready() {
            self.send_closed = true;
        }
        r
    }

    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<In, ConnectionError>>> {
        if self.recv_ended {
            return Poll::Ready(None);
        }
        match self
            .read
            .poll_next::<T, In>(&mut self.codec, Pin::new(&mut self.io), cx)
        {
            Poll::Ready(item) => {
                self.frame_deadline = None;
                if !matches!(item, Some(Ok(_))) {
                    self.recv_ended = true;
                }
                Poll::Ready(item.map(|r| r.map_err(Into::into)))
            }
            Poll::Pending => {
                if self.read.is_empty() {
                    self.frame_deadline = None;
                    return Poll::Pending;
                }
                // A frame has started: it must complete in time.
                let timeout = self.frame_timeout;
                let deadline = self
                    .frame_deadline
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                if deadline.as_mut().poll(cx).is_ready() {
                    self.frame_deadline = None;
                    self.recv_ended = true;
                    return Poll::Ready(Some(Err(FramedError::FrameTimeout(timeout).into())));
                }
                Poll::Pending
            }
        }
    }

    fn is_active(&self) -> bool {
        !(self.recv_ended && self.send_closed)
    }
}

use std::future::Future as _;

/// An I/O error on a Unix socket that names the socket ("could not bind the Unix socket
/// /tmp/w.sock"), with the OS error as its source. Carried inside an `io::Error` of the OS
/// error's kind, so callers still match on `kind()` (`AddrInUse`, `NotFound`, …).
#[derive(Debug)]
pub(crate) struct SocketPathError {
    action: &'static str,
    path: PathBuf,
    source: io::Error,
}

// Read back only by the gRPC client, which rebuilds the error from a borrow of it.
#[cfg_attr(not(feature = "grpc"), allow(dead_code))]
impl SocketPathError {
    /// The socket the error is about.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// What was being done: `"bind"` or `"connect to"`.
    pub(crate) fn action(&self) -> &'static str {
        self.action
    }

    /// A copy of the OS error (same kind, same text), for rebuilding the error from a
    /// borrow of it.
    pub(crate) fn os_error(&self) -> io::Error {
        match self.source.raw_os_error() {
            Some(code) => io::Error::from_raw_os_error(code),
            None => io::Error::new(self.source.kind(), self.source.to_string()),
        }
    }
}

impl fmt::Display for SocketPathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "could not {} the Unix socket {}",
            self.action,
            self.path.display()
        )
    }
}

impl std::error::Error for SocketPathError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// `source`, from doing `action` (`"bind"`, `"connect to"`) on the Unix socket at `path`,
/// as an `io::Error` of the same kind whose text names the path and whose source is
/// `source` (udf §6.4: the socket path is the worker's address).
pub(crate) fn socket_path_error(action: &'static str, path: &Path, source: io::Error) -> io::Error {
    let kind = source.kind();
    let error = SocketPathError {
        action,
        path: path.to_path_buf(),
        source,
    };
    io::Error::new(kind, error)
}

/// Connects to a Unix-domain socket at `path` (engine side: one connection per session to the
/// worker's `--connection` path, udf §1.9 `UnixDomainSocket`, §6.4).
///
/// # Errors
/// The socket error (no listener, permission…), of the OS error's kind; its text names the
/// path ("could not connect to the Unix socket /tmp/w.sock") and the OS error is its source.
pub async fn connect_unix<Out, In>(
    path: impl AsRef<Path>,
    config: &FramedConfig,
) -> io::Result<FramedConnection<UnixStream, Out, In>> {
    let path = path.as_ref();
    let io = UnixStream::connect(path)
        .await
        .map_err(|e| socket_path_error("connect to", path, e))?;
    Ok(FramedConnection::new(io, config))
}

/// Connects over TCP (loopback) to `addr` (engine side; udf §1.9 `LocalTcpConnection`).
///
/// # Errors
/// The socket error.
pub async fn connect_tcp<Out, In>(
    addr: std::net::SocketAddr,
    config: &FramedConfig,
) -> io::Result<FramedConnection<TcpStream, Out, In>> {
    let io = TcpStream::connect(addr).await?;
    io.set_nodelay(true)?;
    Ok(FramedConnection::new(io, config))
}

/// The worker side's listener: accepts one framed connection per session, on a Unix socket
/// path or a TCP address — the endpoint named by the worker's `--connection` argument
/// (udf §1.9 `WorkerConnectionSpec`).
#[derive(Debug)]
pub enum FramedListener {
    /// Listening on a Unix-domain socket.
    Unix(UnixListener),
    /// Listening on TCP.
    Tcp(TcpListener),
}

impl FramedListener {
    /// Binds a Unix-domain socket at `path` (the worker's `--connection` argument; udf §1.9
    /// `UnixDomainSocket`: the worker creates the socket file, udf §6.4).
    ///
    /// # Errors
    /// The bind error (e.g. the path exists: `AddrInUse`; or is longer than the platform
    /// limit), of the OS error's kind; its text names the path ("could not bind the Unix
    /// socket /tmp/w.sock") and the OS error is its source.
    pub fn bind_unix(path: impl AsRef<Path>) -> io::Result<Self> {
        let path = path.as_ref();
        let listener = UnixListener::bind(path).map_err(|e| socket_path_error("bind", path, e))?;
        Ok(Self::Unix(listener))
    }

    /// Binds TCP on `addr` (use a loopback address: udf §1.9 `LocalTcpConnection` has the
    /// worker bind 127.0.0.1 and ::1, one listener each).
    ///
    /// # Errors
    /// The bind error.
    pub async fn bind_tcp(addr: std::net::SocketAddr) -> io::Result<Self> {
        Ok(Self::Tcp(TcpListener::bind(addr).await?))
    }

    /// The bound TCP address, for a TCP listener (its port is the `--connection` value,
    /// udf §1.9).
    pub fn tcp_addr(&self) -> Option<std::net::SocketAddr> {
        match self {
            Self::Tcp(l) => l.local_addr().ok(),
            Self::Unix(_) => None,
        }
    }

    /// Accepts the next session's connection: one per `Execute` stream (udf §1.1).
    ///
    /// # Errors
    /// The accept error.
    pub async fn accept<Out, In>(
        &self,
        config: &FramedConfig,
    ) -> io::Result<SocketConnection<Out, In>> {
        Ok(match self {
            Self::Unix(l) => {
                SocketConnection::Unix(FramedConnection::new(l.accept().await?.0, config))
            }
            Self::Tcp(l) => {
                let (io, _) = l.accept().await?;
                io.set_nodelay(true)?;
                SocketConnection::Tcp(FramedConnection::new(io, config))
            }
        })
    }
}

/// A framed connection over a Unix or TCP socket (what [`FramedListener::accept`] returns, and
/// the engine side of [`FramedTransport`](crate::worker::engine::FramedTransport)): the two
/// transports of udf §1.9 `WorkerConnectionSpec`.
#[derive(Debug)]
pub enum SocketConnection<Out, In> {
    /// Over a Unix-domain socket.
    Unix(FramedConnection<UnixStream, Out, In>),
    /// Over TCP.
    Tcp(FramedConnection<TcpStream, Out, In>),
}

macro_rules! delegate {
    ($self:ident, $c:ident => $e:expr) => {
        match $self {
            SocketConnection::Unix($c) => $e,
            SocketConnection::Tcp($c) => $e,
        }
    };
}

impl<Out, In> Connection<Out, In> for SocketConnection<Out, In>
where
    Out: prost::Message + 'static,
    In: prost::Message + Default,
{
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnectionError>> {
        delegate!(self, c => c.poll_ready(cx))
    }
    fn start_send(&mut self, msg: Out) -> Result<(), ConnectionError> {
        delegate!(self, c => c.start_send(msg))
    }
    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnectionError>> {
        delegate!(self, c => c.poll_flush(cx))
    }
    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnectionError>> {
        delegate!(self, c => c.poll_close(cx))
    }
    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<In, ConnectionError>>> {
        delegate!(self, c => c.poll_recv(cx))
    }
    fn is_active(&self) -> bool {
        delegate!(self, c => Connection::<Out, In>::is_active(c))
    }
}
