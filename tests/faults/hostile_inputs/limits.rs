//! Catalog rows that need real sockets and the real clock: many streams or connections at
//! once against a worker. Each row runs on a runtime of its own (multi-threaded, real time),
//! because the catalog's paused clock would jump past every timeout while the runtime waits
//! on socket I/O.

#[cfg(feature = "grpc")]
use std::future::Future;

/// Runs `row` on a fresh multi-threaded runtime with the real clock, on a thread of its own,
/// and waits for it without blocking the calling (paused-clock) runtime. Only the `grpc`
/// rows use it (without the feature they say so and run nothing).
#[cfg(feature = "grpc")]
pub async fn on_real_clock<F, Fut>(row: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    let thread = std::thread::spawn(move || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(row())
    });
    let joined = tokio::task::spawn_blocking(move || thread.join())
        .await
        .expect("the joining task ran");
    if let Err(panic) = joined {
        std::panic::resume_unwind(panic);
    }
}

#[cfg(feature = "grpc")]
pub mod grpc {
    //! Row 13: 10 000 concurrent `Execute` streams on one gRPC worker.

    use std::io;
    use std::path::PathBuf;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use bytes::Bytes;
    use tether::spark::udf_grpc::{
        GrpcChannel, GrpcConfig, GrpcEngineConnection, WorkerServer, WorkerService,
    };
    use tether::worker::endpoint::serve;
    use tether::worker::engine::{
        CountingHandle, Session, SessionConfig, TerminationKind, WorkerAddress, WorkerHandle,
    };
    use tether::worker::state;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::UnixStream;

    use tether_testing::echo::{EchoUdf, echo_config};
    use tether_testing::fixtures::ScratchDir;
    use tether_testing::fixtures::init;

    /// Sessions the compliant engine opens at once on one channel.
    const SESSIONS: usize = 10_000;
    /// HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS` (RFC 9113 §6.5.2).
    const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
    /// HTTP/2 error code `REFUSED_STREAM` (RFC 9113 §7).
    const REFUSED_STREAM: u32 = 0x7;

    /// A worker serving the echo UDF on a Unix socket with the default [`GrpcConfig`], and
    /// the most `Execute` streams it ever served at once.
    struct Worker {
        _server: WorkerServer,
        socket: PathBuf,
        _dir: ScratchDir,
        open: Arc<AtomicUsize>,
        most_open: Arc<AtomicUsize>,
    }

    impl Worker {
        fn start() -> Self {
            let dir = ScratchDir::new("row13");
            let socket = dir.join("w.sock");
            let open = Arc::new(AtomicUsize::new(0));
            let most_open = Arc::new(AtomicUsize::new(0));
            let service = {
                let (open, most_open) = (open.clone(), most_open.clone());
                WorkerService::new(move |connection| {
                    let now = open.fetch_add(1, Ordering::SeqCst) + 1;
                    most_open.fetch_max(now, Ordering::SeqCst);
                    let open = open.clone();
                    tokio::spawn(async move {
                        let _outcome = serve(connection, EchoUdf::default(), echo_config()).await;
                        open.fetch_sub(1, Ordering::SeqCst);
                    });
                })
            };
            let server = WorkerServer::bind_unix(&socket, service).expect("bind the worker");
            Worker {
                _server: server,
                socket,
                _dir: dir,
                open,
                most_open,
            }
        }

        async fn channel(&self) -> GrpcChannel {
            GrpcChannel::connect(
                &WorkerAddress::Unix(self.socket.clone()),
                &GrpcConfig::new(),
            )
            .await
            .expect("the worker is ready")
        }
    }

    /// The default limit is set, a compliant engine's sessions past it wait (none is lost,
    /// the worker never serves more at once), `Manage` is answered while they wait, and a
    /// raw HTTP/2 client that ignores the limit has its extra streams refused.
    pub async fn default_stream_limit() {
        let limit = GrpcConfig::default()
            .max_concurrent_streams
            .expect("the gRPC worker sets a default concurrent-stream limit");
        assert!(limit >= 256, "the default limit {limit} is below 256");
        let worker = Worker::start();
        heartbeats_do_not_queue_behind_held_sessions(&worker, limit as usize).await;
        every_queued_session_finishes(&worker, limit as usize).await;
        streams_past_the_limit_are_refused(&worker, limit).await;
    }

    /// `limit` sessions held open in `Streaming`: the next one's init waits for a free
    /// stream, a heartbeat does not; once one held session ends the waiting init completes.
    async fn heartbeats_do_not_queue_behind_held_sessions(worker: &Worker, limit: usize) {
        let channel = worker.channel().await;
        let mut held = Vec::with_capacity(limit);
        for _ in 0..limit {
            let session = Session::new(
                channel.open_session().expect("open"),
                Arc::new(CountingHandle::for_one_session()),
                SessionConfig::default(),
            );
            let (streaming, _) = session.init(init("held")).await.expect("init");
            held.push(streaming);
        }
        assert_eq!(worker.open.load(Ordering::SeqCst), limit);

        let waiting = Session::new(
            channel.open_session().expect("open"),
            Arc::new(CountingHandle::for_one_session()),
            SessionConfig::default(),
        );
        let mut waiting = tokio::spawn(waiting.init(init("waiting")));
        assert!(
            tokio::time::timeout(Duration::from_millis(300), &mut waiting)
                .await
                .is_err(),
            "a session past the worker's limit of {limit} streams was served at once"
        );
        let started = tokio::time::Instant::now();
        channel
            .heartbeat()
            .await
            .expect("Manage is answered while every stream slot is taken");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the heartbeat waited {:?}",
            started.elapsed()
        );

        finish(held.pop().expect("held sessions")).await;
        let (streaming, _) = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("the waiting session is served once a stream ends")
            .expect("the init task ran")
            .expect("init");
        held.push(streaming);
        for streaming in held {
            finish(streaming).await;
        }
        // The worker counts a session until its task returns, a moment after its stream has
        // closed and freed the slot the waiting session takes: the two may overlap by one.
        let most = worker.most_open.load(Ordering::SeqCst);
        assert!(
            (limit..=limit + 1).contains(&most),
            "the worker served {most} sessions at once (limit {limit} streams, + 1 finishing)"
        );
    }

    /// Finishes a session that sent no data: no output, `Finished`.
    async fn finish(streaming: Session<state::Streaming, GrpcEngineConnection>) {
        let mut finishing = streaming.finish().await.expect("finish");
        assert_eq!(finishing.recv().await.expect("recv"), None);
        let termination = finishing.close().await;
        assert_eq!(
            termination.kind(),
            TerminationKind::Finished,
            "{termination}"
        );
    }

    /// 10 000 sessions started at once on one channel: each echoes its own batch and
    /// finishes; the worker serves no more than `limit` at once (plus a few whose streams
    /// have just closed).
    async fn every_queued_session_finishes(worker: &Worker, limit: usize) {
        let channel = worker.channel().await;
        let mut tasks = tokio::task::JoinSet::new();
        for n in 0..SESSIONS {
            let connection = channel.open_session().expect("open");
            tasks.spawn(async move {
                let handle = Arc::new(CountingHandle::for_one_session());
                let session = Session::new(connection, handle.clone(), SessionConfig::default());
                let batch = Bytes::from(format!("batch {n}"));
                let (mut streaming, _) = session.init(init("row 13")).await.expect("init");
                streaming.send(batch.clone()).await.expect("send");
                let mut finishing = streaming.finish().await.expect("finish");
                let mut output = Vec::new();
                while let Some(out) = finishing.recv().await.expect("recv") {
                    output.push(out);
                }
                let termination = finishing.close().await;
                assert_eq!(
                    termination.kind(),
                    TerminationKind::Finished,
                    "{termination}"
                );
                assert_eq!(output, vec![batch], "session {n} lost or duplicated output");
                assert!(!handle.is_invalid());
            });
        }
        let mut finished = 0;
        while let Some(done) = tasks.join_next().await {
            done.expect("a session task");
            finished += 1;
        }
        assert_eq!(finished, SESSIONS);
        // The worker counts a session until its task returns, a moment after its stream
        // has closed and freed the slot; a few finishing sessions may overlap the next ones.
        let most = worker.most_open.load(Ordering::SeqCst);
        let slack = limit / 16;
        assert!(
            most <= limit + slack,
            "the worker served {most} sessions at once (limit {limit} streams + {slack} finishing)"
        );
    }

    /// A hand-written HTTP/2 client that opens `limit + 44` `Execute` streams without waiting
    /// for any: the worker announces the limit and refuses each stream past it with
    /// `RST_STREAM(REFUSED_STREAM)`, and only those.
    async fn streams_past_the_limit_are_refused(worker: &Worker, limit: u32) {
        let extra = 44;
        let mut io = UnixStream::connect(&worker.socket).await.expect("connect");
        io.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        write_frame(&mut io, 0x4, 0, 0, &[]).await; // SETTINGS
        // The server's SETTINGS: acknowledge them and read the limit.
        let announced = loop {
            let (kind, flags, _, payload) = read_frame(&mut io).await.expect("server SETTINGS");
            if kind == 0x4 && flags & 0x1 == 0 {
                write_frame(&mut io, 0x4, 0x1, 0, &[]).await;
                break payload.chunks(6).find_map(|s| {
                    (u16::from_be_bytes([s[0], s[1]]) == SETTINGS_MAX_CONCURRENT_STREAMS)
                        .then(|| u32::from_be_bytes([s[2], s[3], s[4], s[5]]))
                });
            }
        };
        assert_eq!(announced, Some(limit), "SETTINGS_MAX_CONCURRENT_STREAMS");
        let headers = execute_headers();
        for n in 0..limit + extra {
            // END_HEADERS, no END_STREAM: every stream stays open.
            write_frame(&mut io, 0x1, 0x4, 2 * n + 1, &headers).await;
        }
        let mut refused = Vec::new();
        let read_all = async {
            while refused.len() < extra as usize {
                let Some((kind, _, stream, payload)) = read_frame(&mut io).await else {
                    break;
                };
                if kind == 0x3 {
                    let code = u32::from_be_bytes(payload[..4].try_into().unwrap());
                    assert_eq!(code, REFUSED_STREAM, "RST_STREAM code on stream {stream}");
                    refused.push(stream);
                }
                assert_ne!(
                    kind, 0x7,
                    "the worker sent GOAWAY instead of refusing streams"
                );
            }
        };
        tokio::time::timeout(Duration::from_secs(10), read_all)
            .await
            .expect("the worker refused the streams past its limit in time");
        let first_refused = 2 * limit + 1;
        assert_eq!(
            refused,
            (0..extra)
                .map(|k| first_refused + 2 * k)
                .collect::<Vec<_>>(),
            "exactly the streams past the limit are refused"
        );
    }

    /// The request headers of an `Execute` call, HPACK-encoded without Huffman coding or
    /// the dynamic table (RFC 7541 §6.1, §6.2.2).
    fn execute_headers() -> Vec<u8> {
        fn string(block: &mut Vec<u8>, text: &str) {
            block.push(u8::try_from(text.len()).expect("a short string"));
            block.extend_from_slice(text.as_bytes());
        }
        let mut block = vec![0x83, 0x86]; // :method POST, :scheme http (static table)
        block.push(0x04); // :path, literal value
        string(&mut block, "/org.apache.spark.udf.worker.UdfWorker/Execute");
        block.push(0x01); // :authority, literal value
        string(&mut block, "localhost");
        block.extend_from_slice(&[0x0f, 0x10]); // content-type (static index 31)
        string(&mut block, "application/grpc");
        block.push(0x00); // a literal name and value
        string(&mut block, "te");
        string(&mut block, "trailers");
        block
    }

    async fn write_frame(io: &mut UnixStream, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
        let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
        let mut frame = vec![len[1], len[2], len[3], kind, flags];
        frame.extend_from_slice(&stream.to_be_bytes());
        frame.extend_from_slice(payload);
        io.write_all(&frame).await.expect("write a frame");
    }

    /// One frame: (type, flags, stream id, payload); `None` at the end of the connection.
    async fn read_frame(io: &mut UnixStream) -> Option<(u8, u8, u32, Vec<u8>)> {
        let mut header = [0u8; 9];
        match io.read_exact(&mut header).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return None,
            Err(e) => panic!("reading a frame: {e}"),
        }
        let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let stream = u32::from_be_bytes(header[5..9].try_into().unwrap()) & 0x7fff_ffff;
        let mut payload = vec![0u8; len];
        io.read_exact(&mut payload)
            .await
            .expect("a frame's payload");
        Some((header[3], header[4], stream, payload))
    }
}

#[cfg(feature = "grpc")]
pub mod framed {
    //! Row 14: 10 000 idle connections to a framed worker running in its own process; and
    //! idle connections that never send `Init` lose their session slots at the worker's
    //! init timeout (`EndpointConfig::init_timeout`, udf §4.6), so a real session is served.

    use std::io;
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command};
    use std::time::Duration;

    use bytes::Bytes;
    use tether::connection::framed::{FramedConfig, connect_unix};
    use tether::spark::udf_grpc::{WorkerArgs, WorkerMain};
    use tether::wire::{UdfRequest, UdfResponse};
    use tether::worker::endpoint::EndpointConfig;
    use tether::worker::engine::{CountingHandle, Session, SessionConfig, TerminationKind};

    use tether_testing::echo::EchoUdf;
    use tether_testing::fixtures::ScratchDir;
    use tether_testing::fixtures::init;

    /// The environment variable that makes this test binary a framed worker process.
    pub const WORKER_SOCKET_VAR: &str = "TETHER_ROW14_WORKER_SOCKET";
    /// The worker process's init timeout in milliseconds (`EndpointConfig::init_timeout`);
    /// unset: the default.
    const INIT_TIMEOUT_VAR: &str = "TETHER_ROW14_INIT_TIMEOUT_MS";
    /// The short init timeout of the second part of the row.
    const SHORT_INIT_TIMEOUT: Duration = Duration::from_secs(1);
    /// Idle connections past the accept limit in the second part: they wait in the listen
    /// backlog ahead of the real session.
    const QUEUED: usize = 32;
    /// The worker's accept limit in this row (the default, 1024, is documented on
    /// `WorkerMain::with_max_framed_sessions`; a smaller one keeps the row quick).
    const LIMIT: usize = 256;
    /// Idle connections opened against the worker.
    const IDLE: usize = 10_000;

    /// The worker process's `main`: the echo UDF over the framed transport on the socket
    /// named by [`WORKER_SOCKET_VAR`], with the accept limit [`LIMIT`] and the init timeout
    /// [`INIT_TIMEOUT_VAR`] names, if any.
    pub fn worker_process() {
        let socket = std::env::var(WORKER_SOCKET_VAR).expect("run by row 14 only");
        let mut endpoint = EndpointConfig::default();
        if let Ok(ms) = std::env::var(INIT_TIMEOUT_VAR) {
            let ms = ms.parse().expect("the init timeout in ms");
            endpoint.init_timeout = Some(Duration::from_millis(ms));
        }
        let args = WorkerArgs::parse(["--id", "row-14", "--connection", &socket]).expect("args");
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(async {
                WorkerMain::new(EchoUdf::default)
                    .with_endpoint_config(endpoint)
                    .with_framed(FramedConfig::default())
                    .with_max_framed_sessions(LIMIT)
                    .serve(&args)
                    .await
                    .expect("the worker serves");
            });
    }

    /// The worker process and its scratch directory, both gone on drop.
    struct Worker {
        child: Child,
        socket: PathBuf,
        _dir: ScratchDir,
    }

    impl Worker {
        /// A worker process with the default init timeout, or `init_timeout`.
        async fn start(init_timeout: Option<Duration>) -> Self {
            let dir = ScratchDir::new("row14");
            let socket = dir.join("w.sock");
            let mut command = Command::new(std::env::current_exe().expect("the test binary"));
            command
                .args([
                    "hostile_inputs::row_14_worker_process",
                    "--exact",
                    "--ignored",
                    "--nocapture",
                ])
                .env(WORKER_SOCKET_VAR, &socket);
            if let Some(timeout) = init_timeout {
                command.env(INIT_TIMEOUT_VAR, timeout.as_millis().to_string());
            }
            let child = command.spawn().expect("spawn the worker process");
            let worker = Worker {
                child,
                socket,
                _dir: dir,
            };
            for _ in 0..200 {
                if worker.socket.exists() {
                    return worker;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            panic!(
                "the worker did not bind {} within 5 s",
                worker.socket.display()
            );
        }

        /// Descriptors the worker process holds, counted from `/proc`.
        fn descriptors(&self) -> usize {
            std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
                .map(Iterator::count)
                .unwrap_or(0)
        }

        /// The worker's open sessions: its Unix-socket descriptors other than the listener.
        fn sockets(&self) -> usize {
            std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
                .into_iter()
                .flatten()
                .flatten()
                .filter(|fd| {
                    std::fs::read_link(fd.path())
                        .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"))
                })
                .count()
        }
    }

    impl Drop for Worker {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    async fn open_session(
        socket: &Path,
    ) -> Session<
        tether::worker::state::Init,
        tether::connection::framed::FramedConnection<
            tokio::net::UnixStream,
            UdfRequest,
            UdfResponse,
        >,
    > {
        let connection = connect_unix::<UdfRequest, UdfResponse>(socket, &FramedConfig::default())
            .await
            .expect("connect");
        Session::new(
            connection,
            std::sync::Arc::new(CountingHandle::for_one_session()),
            SessionConfig::default(),
        )
    }

    /// A session opened before the flood keeps working through it; the worker holds at
    /// most its accept limit of connections; once the idle ones go, new sessions are served.
    pub async fn idle_connections() {
        flood_of_idle_connections().await;
        idle_connections_time_out().await;
    }

    /// 10 000 idle connections: the accept limit holds, the open session is unaffected.
    async fn flood_of_idle_connections() {
        let worker = Worker::start(None).await;
        let (mut existing, _) = open_session(&worker.socket)
            .await
            .init(init("existing"))
            .await
            .expect("the existing session's init");
        existing
            .send(Bytes::from_static(b"before"))
            .await
            .expect("send");
        let base = worker.descriptors();
        // The listener, the existing session, and the runtime's own (signal) sockets.
        let sockets_before = worker.sockets();

        let mut idle = Vec::with_capacity(IDLE);
        let mut refused = 0;
        for _ in 0..IDLE {
            match tokio::net::UnixStream::connect(&worker.socket).await {
                Ok(stream) => idle.push(stream),
                // The listen backlog is full: the kernel refuses the connection.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => refused += 1,
                Err(e) => panic!("connecting idle connection {}: {e}", idle.len()),
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let sockets = worker.sockets();
        assert_eq!(
            sockets - sockets_before,
            LIMIT - 1,
            "the worker accepts sessions up to its limit of {LIMIT} (the existing one included) \
             and no further"
        );
        assert!(
            worker.descriptors() <= base + LIMIT,
            "the worker's descriptors grew from {base} to {}",
            worker.descriptors()
        );

        existing
            .send(Bytes::from_static(b"during"))
            .await
            .expect("send");
        let mut finishing = existing.finish().await.expect("finish");
        let mut output = Vec::new();
        while let Some(batch) = finishing.recv().await.expect("recv") {
            output.push(batch);
        }
        let termination = finishing.close().await;
        assert_eq!(
            termination.kind(),
            TerminationKind::Finished,
            "{termination}"
        );
        assert_eq!(
            output,
            [Bytes::from_static(b"before"), Bytes::from_static(b"during")]
        );

        drop(idle);
        let (streaming, _) = tokio::time::timeout(
            Duration::from_secs(20),
            open_session(&worker.socket).await.init(init("after")),
        )
        .await
        .expect("a new session is served once the idle connections are gone")
        .expect("init");
        let mut finishing = streaming.finish().await.expect("finish");
        assert_eq!(finishing.recv().await.expect("recv"), None);
        assert_eq!(finishing.close().await.kind(), TerminationKind::Finished);
        eprintln!(
            "row 14: {} idle connections accepted or queued, {refused} refused by the backlog; \
             the worker held {LIMIT} sessions",
            IDLE - refused
        );
    }

    /// Connections that never send `Init` hold every session slot; at the worker's init
    /// timeout they are ended (nothing is sent to them: the worker just closes them, udf §2
    /// R8), their slots are freed, and a real session waiting behind them is served, while
    /// the idle peers still hold their ends open.
    async fn idle_connections_time_out() {
        let worker = Worker::start(Some(SHORT_INIT_TIMEOUT)).await;
        let sockets_before = worker.sockets();
        // No slot can free before this instant plus the init timeout.
        let opened = std::time::Instant::now();
        let mut idle = Vec::with_capacity(LIMIT + QUEUED);
        for _ in 0..LIMIT + QUEUED {
            idle.push(
                tokio::net::UnixStream::connect(&worker.socket)
                    .await
                    .expect("an idle connection fits the accept limit and the backlog"),
            );
        }
        // The real session's connection waits in the backlog behind the queued idle ones.
        let session = open_session(&worker.socket).await;
        let sockets = worker.sockets();
        assert!(
            sockets - sockets_before <= LIMIT,
            "the worker holds at most {LIMIT} sessions, held {}",
            sockets - sockets_before
        );
        let (streaming, _) =
            tokio::time::timeout(Duration::from_secs(20), session.init(init("real")))
                .await
                .expect("the real session is served once the idle ones timed out")
                .expect("init");
        let served_after = opened.elapsed();
        assert!(
            served_after >= SHORT_INIT_TIMEOUT.mul_f32(0.8),
            "the real session was served {served_after:?} after the idle connections opened, \
             before any of them could have timed out: the slots were not all held"
        );
        let mut streaming = streaming;
        streaming
            .send(Bytes::from_static(b"served"))
            .await
            .expect("send");
        let mut finishing = streaming.finish().await.expect("finish");
        assert_eq!(
            finishing.recv().await.expect("recv"),
            Some(Bytes::from_static(b"served"))
        );
        assert_eq!(finishing.recv().await.expect("recv"), None);
        assert_eq!(finishing.close().await.kind(), TerminationKind::Finished);

        // Every idle connection was ended by the worker without a byte sent to it.
        let mut ended = 0;
        for stream in &mut idle {
            let mut buf = [0u8; 16];
            let read = tokio::time::timeout(
                SHORT_INIT_TIMEOUT * 10,
                tokio::io::AsyncReadExt::read(stream, &mut buf),
            )
            .await
            .expect("the worker ends an idle connection at its init timeout");
            match read {
                Ok(0) => ended += 1,
                Ok(n) => panic!("the worker sent {n} bytes to a connection that never sent Init"),
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => ended += 1,
                Err(e) => panic!("reading an idle connection: {e}"),
            }
        }
        assert_eq!(ended, LIMIT + QUEUED);
        let mut sockets = worker.sockets();
        for _ in 0..100 {
            if sockets == sockets_before {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            sockets = worker.sockets();
        }
        assert_eq!(
            sockets, sockets_before,
            "the worker released every timed-out session's socket"
        );
        eprintln!(
            "row 14: {} connections that never sent Init held all {LIMIT} slots; the init \
             timeout of {SHORT_INIT_TIMEOUT:?} freed them and the real session was served after \
             {served_after:?}",
            LIMIT + QUEUED
        );
    }
}
