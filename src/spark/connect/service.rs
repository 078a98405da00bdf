//! The Spark Connect service over an [`ExecutionManager`]: ExecutePlan, ReattachExecute,
//! ReleaseExecute, Interrupt and ReleaseSession in full, Config and AnalyzePlan through the
//! user's [`QueryEngine`], FetchErrorDetails from the sessions' stored errors, AddArtifacts and
//! ArtifactStatus over an [`ArtifactStore`], CloneSession and GetStatus (rx §1, §4, §5;
//! connect §3, §8, §9, §14, §15).

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use futures::stream::{BoxStream, Stream, StreamExt};
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;

use super::ConnectHealth;
use super::artifacts::{ArtifactSession, ArtifactStore, MemoryArtifactStore, SessionArtifacts};
use super::chunks::Chunking;
use super::generated::spark_connect_service_server::{
    SparkConnectService, SparkConnectServiceServer,
};
use super::status::{carries_error_info, status_with_error_id};
use crate::execution::keys::shown;
use crate::execution::{AdmissionPermit, Correlation};
use crate::execution::{ConnectError, ExecutionManager, Producer, ResponseStream, SessionKey};
use crate::wire::connect::{
    AddArtifactsRequest, AddArtifactsResponse, AnalyzePlanRequest, AnalyzePlanResponse,
    ArtifactStatusesRequest, ArtifactStatusesResponse, CloneSessionRequest, CloneSessionResponse,
    ConfigRequest, ConfigResponse, ExecutePlanRequest, ExecutePlanResponse,
    FetchErrorDetailsRequest, FetchErrorDetailsResponse, GetStatusRequest, GetStatusResponse,
    InterruptRequest, InterruptResponse, KeyValue, ReattachExecuteRequest, ReleaseExecuteRequest,
    ReleaseExecuteResponse, ReleaseSessionRequest, ReleaseSessionResponse, UserContext,
    analyze_plan_request, analyze_plan_response, config_request, release_execute_request,
};

/// The responses of one ExecutePlan, in order: the schema and Arrow batches, metrics, and
/// finally `Ok` end or an `Err` (a Spark error, delivered to the client after every earlier
/// response, rx §2.2 T8). The service adds `ResultComplete` for reattachable executions
/// and stamps every id (rx §3.2); a source does not set them.
pub type ResponseSource = BoxStream<'static, Result<ExecutePlanResponse, ConnectError>>;

/// Who runs a request: the session it belongs to (connect §3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionContext {
    /// `UserContext.user_id` of the request.
    pub user_id: String,
    /// The client's `session_id`, as sent.
    pub session_id: String,
    /// The session's one server-side id, on every response (connect §3).
    pub server_side_session_id: String,
    /// The session's artifacts (uploaded with `AddArtifacts`), by name: a
    /// `CachedLocalRelation` of hash `h` reads `artifacts.get("cache/h")` (Spark's
    /// `SessionHolder.artifactManager`; [`ArtifactStore`]).
    pub artifacts: SessionArtifacts,
}

/// The query engine a Spark Connect server plugs into [`ConnectService`]: it turns one
/// ExecutePlan into a stream of responses, and may answer AnalyzePlan and Config itself.
///
/// `execute` is called once per new execution, on the RPC's task; the returned stream is
/// driven on a task of its own, with backpressure from the execution's bounded response
/// log (rx §3), and is dropped as soon as the execution is interrupted or released
/// (rx §2.2 T9, T12), which is how a long query learns to stop.
pub trait QueryEngine: Send + Sync + 'static {
    /// Starts running `request` (its `plan` is opaque bytes: decode the root with
    /// [`Relation::decode`](crate::wire::connect::Relation)).
    ///
    /// What a Spark client needs from the stream (connect §6.1): first a response with
    /// `schema` set (an encoded struct [`DataType`](crate::wire::connect::DataType), e.g.
    /// [`DataType::row`](crate::wire::connect::DataType::row)), then Arrow batches, each
    /// `data` a complete Arrow IPC stream (schema message, record batch, end marker) with
    /// `row_count` set; a result of no rows is still one batch of 0 rows. PySpark's
    /// `toArrow()` also asks [`analyze`](Self::analyze) for the schema first.
    ///
    /// A panic here fails the execution with `[INTERNAL_ERROR]`; a panic inside the
    /// returned stream ends it without completing, which its clients see as an orphaned
    /// execution (SPARK-50735). The server keeps running either way.
    ///
    /// # Errors
    /// A plan the engine cannot run; the execution fails with it (the client sees it after
    /// nothing else).
    fn execute(
        &self,
        session: &SessionContext,
        request: &ExecutePlanRequest,
    ) -> Result<ResponseSource, ConnectError>;

    /// Answers the `schema` and `spark_version` analyses (connect §1.12–§1.16). The default
    /// answers `spark_version` with [`SPARK_VERSION`] and refuses everything else.
    ///
    /// # Errors
    /// The analysis is not supported, or the plan is invalid.
    fn analyze(
        &self,
        session: &SessionContext,
        request: &AnalyzePlanRequest,
    ) -> Result<analyze_plan_response::Result, ConnectError> {
        let _ = session;
        match &request.analyze {
            Some(analyze_plan_request::Analyze::SparkVersion(_)) => Ok(
                analyze_plan_response::Result::SparkVersion(analyze_plan_response::SparkVersion {
                    version: SPARK_VERSION.to_owned(),
                }),
            ),
            _ => Err(ConnectError::Failed {
                message: "[UNSUPPORTED_FEATURE] This server does not support this analysis."
                    .to_owned(),
                code: crate::execution::Code::Internal,
            }),
        }
    }

    /// The statement text to report on the execution's `OperationAnalyzed` event (Spark
    /// renders the plan into `statementText`, `ExecuteEventsManager.postStarted`; tether
    /// renders no plan, so only what the engine supplies is reported). Called once per new
    /// execution after [`execute`](Self::execute) accepted it. The default reports none.
    fn statement_text(&self, request: &ExecutePlanRequest) -> Option<String> {
        let _ = request;
        None
    }

    /// The value a session's configuration starts with for `key`, if any (the entries a
    /// client reads before it has set them, e.g. `spark.sql.session.timeZone`). The default
    /// is [`default_conf`].
    fn default_conf(&self, key: &str) -> Option<String> {
        default_conf(key)
    }

    /// Copies the engine's state of session `source` (temporary views, registered
    /// functions, catalog state) into the new session `target`, for CloneSession (connect §14;
    /// Spark's `SparkSession.cloneSession`). Called once per CloneSession after the service
    /// created `target` and copied the session configuration; not under any lock of the
    /// service. The two sessions are independent afterwards. The default copies nothing (an
    /// engine without session state).
    ///
    /// # Errors
    /// The engine cannot copy the state: the CloneSession fails with this error, and the
    /// service removes `target` again (no tombstone; its id may be used again). A panic is
    /// answered as `[INTERNAL_ERROR]` the same way.
    fn clone_session(
        &self,
        source: &SessionContext,
        target: &SessionContext,
    ) -> Result<(), ConnectError> {
        let _ = (source, target);
        Ok(())
    }
}

/// The Spark version tether's Spark Connect service reports: the protocol it speaks is
/// Spark 4.3.0's (connect §1.16).
pub const SPARK_VERSION: &str = "4.3.0";

/// Spark 4.3.0's default for each configuration key PySpark 4.2 reads from the server
/// (`toPandas()`, `createDataFrame`, error display, REPL rendering, UDFs; the table of
/// docs/reference/spark-connect.md §12, every value measured with one raw-gRPC Config `Get`
/// against Spark 4.3.0), `None` for any other key. `spark.sql.session.timeZone` is
/// `Etc/UTC` (Spark's is the JVM's zone; connect §3). Two differ from Spark's on purpose:
/// `spark.connect.session.planCompression.threshold` is `-1` and
/// `spark.connect.session.planCompression.defaultAlgorithm` is `NONE` (Spark: `10485760`,
/// `ZSTD`), because tether reads no `Plan.compressed_operation`: with these PySpark never
/// compresses a plan.
pub fn default_conf(key: &str) -> Option<String> {
    Some(
        match key {
            "spark.sql.session.timeZone" => "Etc/UTC",
            "spark.sql.ansi.enabled" => "true",
            "spark.sql.timestampType" => "TIMESTAMP_LTZ",
            "spark.sql.execution.arrow.maxRecordsPerBatch" => "10000",
            "spark.sql.execution.arrow.pyspark.enabled" => "true",
            "spark.sql.execution.arrow.pyspark.selfDestruct.enabled" => "false",
            "spark.sql.execution.arrow.useLargeVarTypes" => "false",
            "spark.sql.execution.pandas.structHandlingMode" => "legacy",
            "spark.sql.execution.pandas.convertToArrowArraySafely" => "true",
            "spark.sql.execution.pandas.inferPandasDictAsMap" => "false",
            "spark.sql.execution.pyspark.binaryAsBytes" => "true",
            "spark.sql.execution.pythonUDF.arrow.enabled" => "true",
            "spark.sql.execution.pythonUDTF.arrow.enabled" => "true",
            "spark.sql.pyspark.inferNestedDictAsStruct.enabled" => "false",
            "spark.sql.pyspark.legacy.inferArrayTypeFromFirstElement.enabled" => "false",
            "spark.sql.pyspark.legacy.inferMapTypeFromFirstPair.enabled" => "false",
            "spark.sql.pyspark.jvmStacktrace.enabled" => "false",
            "spark.sql.pyspark.plotting.max_rows" => "1000",
            "spark.sql.connect.serverStacktrace.enabled" => "true",
            "spark.sql.repl.eagerEval.enabled" => "false",
            "spark.sql.repl.eagerEval.maxNumRows" => "20",
            "spark.sql.repl.eagerEval.truncate" => "20",
            "spark.sql.session.localRelationCacheThreshold" => "1048576",
            "spark.sql.session.localRelationSizeLimit" => "3221225472",
            "spark.sql.session.localRelationChunkSizeRows" => "10000",
            "spark.sql.session.localRelationChunkSizeBytes" => "16777216",
            "spark.sql.session.localRelationBatchOfChunksSizeBytes" => "1073741824",
            "spark.connect.session.planCompression.threshold" => "-1",
            "spark.connect.session.planCompression.defaultAlgorithm" => "NONE",
            _ => return None,
        }
        .to_owned(),
    )
}

/// Settings of a [`ConnectService`] beyond the manager's (connect §4).
#[derive(Debug, Clone, Default)]
pub struct ConnectConfig {
    /// The pre-shared token every RPC must carry as `authorization: Bearer <token>`
    /// (connect §4; Spark's `spark.connect.authenticate.token`). `None`: no authentication.
    pub token: Option<String>,
}

/// Most session configurations kept before entries of sessions that no longer exist are
/// dropped.
const CONF_SWEEP_AT: usize = 4096;

/// One session's configuration, with the key that tells whether the session still exists.
type SessionConf = (SessionKey, BTreeMap<String, String>);

struct Inner<E> {
    manager: ExecutionManager,
    engine: E,
    /// Per-session configuration, by server-side session id (so a session re-created after
    /// ReleaseSession starts fresh).
    confs: Mutex<HashMap<String, SessionConf>>,
    /// What `grpc.health.v1` reports for this service (connect §7.2).
    health: ConnectHealth,
    /// The token of the connections accepted since the last cut (see
    /// [`ConnectService::connections`]); a drain's deadline cancels it and starts a new one.
    connections: Mutex<CancellationToken>,
    /// Handlers running ([`ConnectService::rpcs_in_flight`]).
    rpcs: Arc<AtomicUsize>,
    /// The largest chunk of a result batch ([`ConnectService::with_max_chunk_size`]).
    max_chunk_size: AtomicUsize,
    /// The tokens of this service's gRPC services ([`ConnectService::into_service`]), which
    /// no Config answer carries (connect §12).
    tokens: super::config::ServerTokens,
    /// Every session's artifacts (`AddArtifacts`, connect §9).
    artifacts: Arc<dyn ArtifactStore>,
    /// Their metrics (kept bytes, refused uploads).
    artifact_metrics: super::artifacts::ArtifactMetrics,
}

/// One running handler, counted in [`ConnectService::rpcs_in_flight`] until dropped.
struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

/// Spark Connect's `SparkConnectService` over an [`ExecutionManager`] and a [`QueryEngine`].
/// Mount [`into_service`](Self::into_service) on a `tonic::transport::Server`.
///
/// Every RPC runs in a session (get or create, connect §3), and every response carries the
/// session's `server_side_session_id`. Errors go out as Spark sends them: INTERNAL with
/// `[CONDITION] text SQLSTATE: state` and a rich-status `ErrorInfo` (connect §2).
///
/// Each ExecutePlan, ReattachExecute, ReleaseExecute, Interrupt and ReleaseSession emits one
/// `DEBUG` tracing event (target `tether::spark::connect::service`) naming the user,
/// session and operation, and the error when the RPC fails.
pub struct ConnectService<E> {
    inner: Arc<Inner<E>>,
}

impl<E> Clone for ConnectService<E> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

fn user_of(context: Option<&UserContext>) -> &str {
    context.map_or("", |c| c.user_id.as_str())
}

fn session_key(user_id: &str, session_id: &str) -> Option<SessionKey> {
    Some(SessionKey {
        user_id: Arc::from(user_id),
        session_id: crate::execution::keys::parse_uuid(session_id)?,
    })
}

impl<E: QueryEngine> ConnectService<E> {
    /// A service over `manager` (its registry, sessions and stream rotation, rx §4, §5)
    /// running queries on `engine`, keeping artifacts in a [`MemoryArtifactStore`] with the
    /// default limits ([`ArtifactLimits`](super::ArtifactLimits)).
    pub fn new(manager: ExecutionManager, engine: E) -> Self {
        Self::with_artifact_store(manager, engine, Arc::new(MemoryArtifactStore::default()))
    }

    /// A service as [`new`](Self::new) makes it, keeping the sessions' artifacts
    /// (`AddArtifacts`, Spark's `ArtifactManager`) in `artifacts`.
    pub fn with_artifact_store(
        manager: ExecutionManager,
        engine: E,
        artifacts: Arc<dyn ArtifactStore>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                manager,
                engine,
                confs: Mutex::new(HashMap::new()),
                health: ConnectHealth::new(),
                connections: Mutex::new(CancellationToken::new()),
                rpcs: Arc::new(AtomicUsize::new(0)),
                max_chunk_size: AtomicUsize::new(super::chunks::DEFAULT_MAX_CHUNK_SIZE),
                tokens: super::config::ServerTokens::default(),
                artifacts,
                artifact_metrics: super::artifacts::ArtifactMetrics::register(),
            }),
        }
    }

    /// Sets the largest chunk a result batch is split into when the client allows chunking
    /// (Spark's `spark.connect.session.resultChunking.maxChunkSize`, connect §10; default
    /// [`DEFAULT_MAX_CHUNK_SIZE`](super::DEFAULT_MAX_CHUNK_SIZE), 90 % of
    /// [`MAX_MESSAGE_SIZE`](super::MAX_MESSAGE_SIZE)); a client's preferred chunk size is
    /// used when it lies between 1 KiB and this. `0` turns chunking off, as Spark's `-1`
    /// does: a batch whose response exceeds `MAX_MESSAGE_SIZE` then fails with
    /// `ARROW_BATCH_TOO_LARGE`. Values above `DEFAULT_MAX_CHUNK_SIZE` are capped to it, so
    /// that a chunk's response always fits a message. Applies to executions started
    /// afterwards.
    #[must_use]
    pub fn with_max_chunk_size(self, bytes: usize) -> Self {
        let bytes = bytes.min(super::chunks::DEFAULT_MAX_CHUNK_SIZE);
        self.inner.max_chunk_size.store(bytes, Ordering::Relaxed);
        self
    }

    /// Where the sessions' artifacts are kept ([`with_artifact_store`](Self::with_artifact_store);
    /// connect §9).
    pub fn artifact_store(&self) -> &Arc<dyn ArtifactStore> {
        &self.inner.artifacts
    }

    /// Frees the artifacts of every session the manager no longer has (released or expired,
    /// rx §5.6; connect §9.3) and publishes the artifact metrics
    /// (`tether_connect_artifact_bytes`, `…_uploads_refused_total`; see
    /// [`observe`](crate::observe)). [`ConnectServer`](super::ConnectServer) calls it on every
    /// maintenance interval; each upload also frees what ended sessions hold, first.
    pub fn sweep_artifacts(&self) {
        let store = self.inner.artifacts.as_ref();
        super::artifacts::sweep(store, &self.inner.manager);
        self.inner.artifact_metrics.publish(store);
    }

    /// The manager the service registers executions in (rx §5).
    pub fn manager(&self) -> &ExecutionManager {
        &self.inner.manager
    }

    /// How many RPC handlers are running: from the decoded request to the response (for
    /// ExecutePlan and ReattachExecute, to the response stream handed out; the stream
    /// itself is its execution's, counted by the manager). A request whose message has not
    /// fully arrived has no handler yet and is not counted: what a server's connections
    /// still hold once this and the manager's executions are 0 reached no handler
    /// (tether's own, for the drain of docs/deployment.md over the rx §5.1 registry; see
    /// [`drain`](Self::drain) and [`close_connections`](Self::close_connections)).
    pub fn rpcs_in_flight(&self) -> usize {
        self.inner.rpcs.load(Ordering::Acquire)
    }

    fn in_flight(&self) -> InFlight {
        self.inner.rpcs.fetch_add(1, Ordering::AcqRel);
        InFlight(self.inner.rpcs.clone())
    }

    /// The service's health (connect §7.2): serve
    /// [`ConnectHealth::service`] on the same server for the standard `grpc.health.v1`
    /// service, `SERVING` while this service takes new work.
    pub fn health(&self) -> &ConnectHealth {
        &self.inner.health
    }

    /// The gRPC service to add to a `tonic::transport::Server`: this service behind the
    /// token check of `config` (connect §4), with message limits raised to 128 MiB (Spark's
    /// `spark.connect.grpc.maxInboundMessageSize`), answering `UNIMPLEMENTED` with the method's
    /// name for the methods of Spark's service it does not serve.
    ///
    /// Serve it with `TCP_NODELAY` on (tonic's `TcpIncoming::with_nodelay(Some(true))`, or
    /// `Server::builder().tcp_nodelay(true)`): a reattaching client makes a round trip per
    /// rotated stream, and Nagle's algorithm delays each by up to 40 ms.
    ///
    /// The service keeps `config`'s token: no Config answer of this service (through any
    /// of its gRPC services) carries a value containing it, and a Set or Unset of
    /// `spark.connect.authenticate.token` is refused as Spark refuses it (connect §12).
    pub fn into_service(self, config: &ConnectConfig) -> ConnectGrpcService<E> {
        if let Some(token) = &config.token {
            self.inner.tokens.add(token);
        }
        let server = SparkConnectServiceServer::new(self)
            .max_decoding_message_size(super::MAX_MESSAGE_SIZE)
            .max_encoding_message_size(super::MAX_MESSAGE_SIZE);
        ConnectGrpcService {
            inner: InterceptedService::new(
                server,
                super::auth::TokenCheck::new(config.token.as_deref()),
            ),
        }
    }

    /// Wraps a server's accepted connections (tonic's `serve_with_incoming`) so that a
    /// [`drain`](Self::drain) can cut them at its deadline. An execution's error travels
    /// after every response already handed to HTTP/2, and a slow client holds up to its
    /// whole flow-control window of those (megabytes; minutes of reading) before it would
    /// read the error, by when the server is gone. So when the deadline cancels executions,
    /// the drain closes every connection accepted so far: gRPC clients see `UNAVAILABLE`,
    /// Spark clients retry with a ReattachExecute on a new connection (rx §6.2), and the
    /// canceled execution answers it with `OPERATION_CANCELED` at once. Connections
    /// accepted after the cut are served as usual. Without this wrapper a drain still
    /// cancels, and clients get the error after what is in flight.
    pub fn connections<S, IO, Err>(
        &self,
        incoming: S,
    ) -> impl Stream<Item = Result<super::accepted::DrainConnection<IO>, Err>> + use<S, IO, Err, E>
    where
        S: Stream<Item = Result<IO, Err>>,
    {
        let service = self.clone();
        incoming.map(move |accepted| {
            let token = service
                .inner
                .connections
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            accepted.map(|io| super::accepted::DrainConnection::new(io, token))
        })
    }

    /// Closes every connection [`connections`](Self::connections) accepted so far (their
    /// reads and writes fail, so a graceful shutdown waiting for their streams ends); later
    /// ones are served as usual. A drain's deadline does it; a server can do it after its
    /// drain when its graceful shutdown waits for streams that hold nothing of the service
    /// (no execution, [`rpcs_in_flight`](Self::rpcs_in_flight) 0: requests that never
    /// reached a handler, such as one whose body never arrived). Clients of the closed
    /// connections see `UNAVAILABLE` and Spark clients retry (rx §6.2).
    pub fn close_connections(&self) {
        let old = std::mem::take(
            &mut *self
                .inner
                .connections
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        old.cancel();
    }

    fn session(
        &self,
        user_id: &str,
        session_id: &str,
        observed: Option<&str>,
    ) -> Result<SessionContext, ConnectError> {
        let server_side = self
            .inner
            .manager
            .get_or_create_session(user_id, session_id, observed)?;
        Ok(self.session_context(user_id, session_id, server_side))
    }

    /// The context of the session with these ids, its artifacts included.
    fn session_context(
        &self,
        user_id: &str,
        session_id: &str,
        server_side_session_id: String,
    ) -> SessionContext {
        let artifacts = SessionArtifacts::new(
            self.inner.artifacts.clone(),
            ArtifactSession {
                user_id: user_id.to_owned(),
                session_id: session_id.to_owned(),
                server_side_session_id: server_side_session_id.clone(),
            },
        );
        SessionContext {
            user_id: user_id.to_owned(),
            session_id: session_id.to_owned(),
            server_side_session_id,
            artifacts,
        }
    }

    /// Drives `source` into `producer` on a task of its own, in the execution's span,
    /// stopping when the execution is interrupted or released (rx §2.2 T7–T9). An engine
    /// that accepted the plan has analyzed it, and is ready once its stream is driven
    /// (Spark's `postAnalyzed`, `postReadyForExecution`, rx §2.1 item 4); a plan it refused
    /// fails the execution straight from Started, as Spark allows.
    ///
    /// Each batch goes out as [`Chunking`] says (connect §10). The admission `permit` is
    /// held until the run ends (the engine's stream finished, failed or was dropped).
    fn run(
        producer: Producer,
        source: Result<ResponseSource, ConnectError>,
        statement_text: Option<String>,
        (chunking, permit): (Chunking, AdmissionPermit),
        span: tracing::Span,
    ) {
        let mut producer = producer;
        let mut source = match source {
            Ok(s) => s,
            Err(e) => {
                let _ = producer.fail(e);
                return;
            }
        };
        // Refused only once the execution was canceled meanwhile: nothing to report then.
        let _ = producer.analyzed(statement_text);
        let _ = producer.ready_for_execution();
        let task = async move {
            loop {
                let next = tokio::select! {
                    next = source.next() => next,
                    () = producer.cancelled() => return,
                };
                match next {
                    // `push` waits while the unsent bound is reached and fails once the
                    // execution is interrupted or released (it wakes the waiting producer).
                    Some(Ok(response)) => {
                        let responses = match chunking.split(response) {
                            Ok(r) => r,
                            Err(e) => {
                                let _ = producer.fail(e);
                                return;
                            }
                        };
                        for response in responses {
                            if producer.push(response).await.is_err() {
                                return;
                            }
                        }
                    }
                    Some(Err(e)) => {
                        let _ = producer.fail(e);
                        return;
                    }
                    None => {
                        let _ = producer.finish();
                        return;
                    }
                }
            }
        };
        let task = async move {
            task.await;
            drop(permit);
        };
        tokio::spawn(tracing::Instrument::instrument(task, span));
    }

    fn conf_answer(
        &self,
        session: &SessionContext,
        operation: Option<config_request::operation::OpType>,
    ) -> Result<(Vec<KeyValue>, Vec<String>), ConnectError> {
        let Some(key) = session_key(&session.user_id, &session.session_id) else {
            return Err(ConnectError::InvalidHandleFormat {
                handle: shown(&session.session_id).into_owned(),
            });
        };
        // The engine's defaults fill the answer after the lock is released (the engine's
        // code never runs under it).
        let hider = self.inner.tokens.hider();
        let pending = {
            let mut confs = self
                .inner
                .confs
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if confs.len() >= CONF_SWEEP_AT {
                let manager = &self.inner.manager;
                confs.retain(|server_side, (k, _)| {
                    manager.server_side_session_id(k).as_deref() == Some(server_side.as_str())
                });
            }
            let conf = &mut confs
                .entry(session.server_side_session_id.clone())
                .or_insert_with(|| (key, BTreeMap::new()))
                .1;
            super::config::apply(conf, operation, hider)?
        };
        let pairs = pending.answer(|key| self.inner.engine.default_conf(key))?;
        Ok((pairs, Vec::new()))
    }
}

type StatusStream = Pin<Box<dyn Stream<Item = Result<ExecutePlanResponse, tonic::Status>> + Send>>;

/// The responses of one RPC as gRPC items: the first error ends the stream with its status
/// (connect §2), with the `errorId` `error_id` gives it (connect §8.1).
fn as_grpc(
    stream: ResponseStream,
    span: tracing::Span,
    error_id: impl Fn(&ConnectError) -> Option<String> + Send + 'static,
) -> StatusStream {
    Box::pin(InSpan {
        inner: stream.map(move |item| item.map_err(|e| stream_error(&e, error_id(&e)))),
        span,
    })
}

/// A response stream polled inside its RPC's span, so that what the execution logs while
/// the stream is read sits in that span.
#[pin_project::pin_project]
struct InSpan<S> {
    #[pin]
    inner: S,
    span: tracing::Span,
}

impl<S: Stream> Stream for InSpan<S> {
    type Item = S::Item;

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<S::Item>> {
        let this = self.project();
        let _entered = this.span.enter();
        this.inner.poll_next(cx)
    }
}

/// An error an RPC answers itself (a refusal: an unknown or abandoned operation, a session
/// that changed or closed, a configuration key that does not exist, a plan the engine
/// refused, …) as the client's status, logged in the RPC's span (which names the RPC and the
/// ids) with its Spark condition, as Spark's `ErrorUtils.handleError` logs "Spark Connect
/// RPC error during: …" (rx §1.8, connect §2). Spark logs every one at ERROR; tether logs
/// those that carry a Spark condition, the client's own mistakes or races (PySpark asks for
/// configuration keys a server may not have, and its release can overtake its
/// `ReleaseSession`), and retryable ones (`UNAVAILABLE`, as while the server drains) at
/// INFO, and only the others, which say something failed in the server, at ERROR, so that
/// an operator can alert on ERROR.
///
/// `error_id` is the `errorId` its `ErrorInfo` carries, if any (connect §8.1).
fn rpc_error(e: &ConnectError, error_id: Option<&str>) -> tonic::Status {
    let condition = logged_condition(e);
    let clients = condition != "OTHER" || e.code() == crate::execution::Code::Unavailable;
    if clients {
        tracing::info!(condition, error = %e, "Spark Connect RPC error");
    } else {
        tracing::error!(condition, error = %e, "Spark Connect RPC error");
    }
    status_with_error_id(e, error_id)
}

/// An execution's error ending its response stream (the query failed or was canceled,
/// rx §2.2 T8–T9, or a stream position is gone, rx §1.8) as the client's status, logged at
/// INFO in the RPC's span, as Spark's `ErrorUtils.handleError` logs "Spark Connect error
/// during: …" for errors inside an execution: they are the user's query's, not the
/// server's. `error_id` is the `errorId` its `ErrorInfo` carries, if any (connect §8.1).
fn stream_error(e: &ConnectError, error_id: Option<String>) -> tonic::Status {
    tracing::info!(
        condition = logged_condition(e),
        error = %e,
        "Spark Connect error on a response stream"
    );
    status_with_error_id(e, error_id.as_deref())
}

/// The condition an error is logged with: tether's own (rx §1.8), else the engine's
/// ([`SparkError::condition`](crate::execution::SparkError::condition)), else `OTHER`.
fn logged_condition(e: &ConnectError) -> &str {
    match e {
        ConnectError::Spark(spark) => spark.condition.as_deref(),
        other => other.condition(),
    }
    .unwrap_or("OTHER")
}

/// The span of one RPC of the service, carrying the request's ids (connect §3).
fn rpc_span(
    rpc: &'static str,
    user_id: &str,
    session_id: &str,
    operation_id: &str,
    correlation: &Correlation,
) -> tracing::Span {
    let span = tracing::info_span!(
        "spark_connect_rpc",
        rpc,
        user_id = %shown(user_id),
        session_id = %shown(session_id),
        operation_id = %shown(operation_id),
        operation_id_header = tracing::field::Empty,
        request_id = tracing::field::Empty,
        traceparent = tracing::field::Empty,
    );
    record_correlation(&span, correlation);
    span
}

/// Puts `correlation`'s ids on `span` (its fields `operation_id_header`, `request_id`,
/// `traceparent`; connect §13).
fn record_correlation(span: &tracing::Span, correlation: &Correlation) {
    if let Some(v) = &correlation.operation_id {
        span.record("operation_id_header", &**v);
    }
    if let Some(v) = &correlation.request_id {
        span.record("request_id", &**v);
    }
    if let Some(v) = &correlation.traceparent {
        span.record("traceparent", &**v);
    }
}

/// The correlation ids of a request's headers (connect §13).
fn correlation_of(metadata: &tonic::metadata::MetadataMap) -> Correlation {
    Correlation::from_headers(|name| metadata.get(name).map(|v| v.as_bytes()))
}

impl<E: QueryEngine> ConnectService<E> {
    /// Every RPC's prologue: its span (named after the RPC, carrying the request's ids,
    /// connect §3) entered while `handler` runs, the handler counted in
    /// [`rpcs_in_flight`](Self::rpcs_in_flight), and its error logged and answered as the
    /// client's status ([`rpc_error`]). `handler` gets the span, for the response stream's.
    ///
    /// The request's correlation headers (`metadata`, connect §13) go onto the span; an
    /// operation-id header naming another operation than the body's is logged with both
    /// (the body's counts, as in Spark 4.3.0).
    fn rpc<T>(
        &self,
        rpc: &'static str,
        (user_id, session_id, operation_id): (&str, &str, &str),
        metadata: &tonic::metadata::MetadataMap,
        handler: impl FnOnce(&tracing::Span) -> Result<T, ConnectError>,
    ) -> Result<tonic::Response<T>, tonic::Status> {
        let correlation = correlation_of(metadata);
        let span = rpc_span(rpc, user_id, session_id, operation_id, &correlation);
        let _entered = span.enter();
        if let Some(header) = correlation.operation_id_mismatch(operation_id) {
            tracing::warn!(
                header = %header,
                body = %shown(operation_id),
                "the spark-connect-operation-id header names another operation than the \
                 request's operation_id; the request's is used"
            );
        }
        let _in_flight = self.in_flight();
        handler(&span).map(tonic::Response::new).map_err(|e| {
            let id = self.error_id(user_id, session_id, None, &e);
            rpc_error(&e, id.as_deref())
        })
    }

    /// The `errorId` to send `error` with to a client of the session
    /// `(user_id, session_id)` (connect §8.1): stored in the session for FetchErrorDetails
    /// when its status carries an `ErrorInfo`, the session is live and its conf does not
    /// set `spark.sql.connect.enrichError.enabled` to `false` (Spark's rule); `None`
    /// otherwise. `operation_id` names the execution whose stream delivers it, so that its
    /// error delivered again after a reattach keeps its id ([`ExecutionManager::record_error`]).
    fn error_id(
        &self,
        user_id: &str,
        session_id: &str,
        operation_id: Option<&str>,
        error: &ConnectError,
    ) -> Option<String> {
        if !carries_error_info(error) {
            return None;
        }
        let key = session_key(user_id, session_id)?;
        let server_side = self.inner.manager.server_side_session_id(&key)?;
        let enrich = self
            .inner
            .confs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&server_side)
            .and_then(|(_, conf)| {
                conf.get(super::error_details::ENRICH_ERROR_ENABLED)
                    .cloned()
            });
        if enrich.is_some_and(|v| v.trim().eq_ignore_ascii_case("false")) {
            return None;
        }
        self.inner
            .manager
            .record_error(user_id, session_id, operation_id, error)
    }

    /// What gives the errors of the response stream of `operation_id` in the session
    /// `(user_id, session_id)` their `errorId` ([`error_id`](Self::error_id)).
    fn stream_error_ids(
        &self,
        user_id: &str,
        session_id: &str,
        operation_id: &str,
    ) -> impl Fn(&ConnectError) -> Option<String> + Send + 'static {
        let service = self.clone();
        let (user_id, session_id, operation_id) = (
            user_id.to_owned(),
            session_id.to_owned(),
            operation_id.to_owned(),
        );
        move |e| service.error_id(&user_id, &session_id, Some(&operation_id), e)
    }

    /// ExecutePlan's handler (rx §1.2): registers the execution (or reattaches to the live
    /// one it repeats, rx §5.5), starts the engine on a new one, hands out its stream.
    ///
    /// `permit` is the execution's admission slot ([`ExecutionManager::admit`]), held while
    /// a new execution runs and dropped at once for a duplicate (nothing new runs).
    fn start_execution(
        &self,
        request: &ExecutePlanRequest,
        permit: AdmissionPermit,
        correlation: &Correlation,
        span: &tracing::Span,
    ) -> Result<StatusStream, ConnectError> {
        let submitted = self
            .inner
            .manager
            .execute_plan_correlated(request, correlation)?;
        tracing::debug!(
            operation_id = submitted.operation_id(),
            reattachable = request.is_reattachable(),
            duplicate = matches!(submitted, crate::execution::Submitted::Reattached(_)),
            "ExecutePlan"
        );
        let submitted_id = submitted.operation_id().to_owned();
        let (producer, stream) = submitted.start();
        if let Some(producer) = producer {
            let session = self.session_context(
                request.user_id(),
                &request.session_id,
                producer.server_side_session_id().to_string(),
            );
            // A panicking engine fails its execution instead of the RPC (the client would
            // see a reset stream, not an error it can read).
            let source = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.inner.engine.execute(&session, request)
            }))
            .unwrap_or_else(|_| {
                tracing::error!(
                    operation_id = submitted_id.as_str(),
                    "QueryEngine::execute panicked"
                );
                Err(ConnectError::Failed {
                    message: "[INTERNAL_ERROR] The query engine panicked while starting the \
                              execution. SQLSTATE: XX000"
                        .to_owned(),
                    code: crate::execution::Code::Internal,
                })
            });
            let statement_text = source
                .is_ok()
                .then(|| self.inner.engine.statement_text(request))
                .flatten();
            let execution_span = tracing::info_span!(
                "spark_connect_execution",
                user_id = %shown(request.user_id()),
                session_id = %shown(&request.session_id),
                operation_id = submitted_id.as_str(),
                operation_id_header = tracing::field::Empty,
                request_id = tracing::field::Empty,
                traceparent = tracing::field::Empty,
            );
            record_correlation(&execution_span, correlation);
            let chunking = Chunking::of(
                request,
                self.inner.max_chunk_size.load(Ordering::Relaxed),
                super::MAX_MESSAGE_SIZE,
            );
            Self::run(
                producer,
                source,
                statement_text,
                (chunking, permit),
                execution_span,
            );
        }
        let error_ids =
            self.stream_error_ids(request.user_id(), &request.session_id, &submitted_id);
        Ok(as_grpc(stream, span.clone(), error_ids))
    }
}

#[tonic::async_trait]
impl<E: QueryEngine> SparkConnectService for ConnectService<E> {
    type ExecutePlanStream = StatusStream;
    type ReattachExecuteStream = StatusStream;

    async fn execute_plan(
        &self,
        request: tonic::Request<ExecutePlanRequest>,
    ) -> Result<tonic::Response<Self::ExecutePlanStream>, tonic::Status> {
        let (metadata, request) = (request.metadata(), request.get_ref());
        let operation_id = request.operation_id.as_deref().unwrap_or("");
        let ids = (request.user_id(), request.session_id.as_str(), operation_id);
        // Admission first (waiting if the server is at its cap), so that nothing is
        // registered while it waits; its refusal is answered like any other error.
        let admitted = self.inner.manager.admit(request.user_id()).await;
        self.rpc("ExecutePlan", ids, metadata, |span| {
            let correlation = correlation_of(metadata);
            self.start_execution(request, admitted?, &correlation, span)
        })
    }

    async fn reattach_execute(
        &self,
        request: tonic::Request<ReattachExecuteRequest>,
    ) -> Result<tonic::Response<Self::ReattachExecuteStream>, tonic::Status> {
        let (metadata, request) = (request.metadata(), request.get_ref());
        let ids = (
            request.user_id(),
            request.session_id.as_str(),
            request.operation_id.as_str(),
        );
        self.rpc("ReattachExecute", ids, metadata, |span| {
            tracing::debug!(
                last_response_id = %shown(request.last_response_id.as_deref().unwrap_or("")),
                "ReattachExecute"
            );
            let stream = self.inner.manager.reattach_execute(request)?;
            let error_ids = self.stream_error_ids(
                request.user_id(),
                &request.session_id,
                &request.operation_id,
            );
            Ok(as_grpc(stream, span.clone(), error_ids))
        })
    }

    async fn release_execute(
        &self,
        request: tonic::Request<ReleaseExecuteRequest>,
    ) -> Result<tonic::Response<ReleaseExecuteResponse>, tonic::Status> {
        let (metadata, request) = (request.metadata(), request.get_ref());
        let ids = (
            request.user_id(),
            request.session_id.as_str(),
            request.operation_id.as_str(),
        );
        self.rpc("ReleaseExecute", ids, metadata, |_| {
            let response = self.inner.manager.release_execute(request)?;
            tracing::debug!(
                release = match &request.release {
                    Some(release_execute_request::Release::ReleaseAll(_)) => "all",
                    Some(release_execute_request::Release::ReleaseUntil(_)) => "until",
                    None => "none",
                },
                found = response.operation_id.is_some(),
                "ReleaseExecute"
            );
            Ok(response)
        })
    }

    async fn interrupt(
        &self,
        request: tonic::Request<InterruptRequest>,
    ) -> Result<tonic::Response<InterruptResponse>, tonic::Status> {
        let (metadata, request) = (request.metadata(), request.get_ref());
        let ids = (request.user_id(), request.session_id.as_str(), "");
        self.rpc("Interrupt", ids, metadata, |_| {
            let response = self.inner.manager.interrupt(request)?;
            tracing::debug!(
                interrupt_type = request.interrupt_type,
                interrupted = response.interrupted_ids.len(),
                "Interrupt"
            );
            Ok(response)
        })
    }

    async fn release_session(
        &self,
        request: tonic::Request<ReleaseSessionRequest>,
    ) -> Result<tonic::Response<ReleaseSessionResponse>, tonic::Status> {
        let (metadata, request) = (request.metadata(), request.get_ref());
        let ids = (
            user_of(request.user_context.as_ref()),
            request.session_id.as_str(),
            "",
        );
        self.rpc("ReleaseSession", ids, metadata, |_| {
            let response = self.inner.manager.release_session(request);
            tracing::debug!("ReleaseSession");
            if !response.server_side_session_id.is_empty() {
                self.inner.artifacts.release_session(&ArtifactSession {
                    user_id: request.user_id().to_owned(),
                    session_id: request.session_id.clone(),
                    server_side_session_id: response.server_side_session_id.clone(),
                });
                self.inner
                    .confs
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&response.server_side_session_id);
            }
            Ok(response)
        })
    }

    async fn add_artifacts(
        &self,
        request: tonic::Request<tonic::Streaming<AddArtifactsRequest>>,
    ) -> Result<tonic::Response<AddArtifactsResponse>, tonic::Status> {
        // The ids come with the stream's first message (recorded on the span then).
        let correlation = correlation_of(request.metadata());
        let span = tracing::info_span!(
            "spark_connect_rpc",
            rpc = "AddArtifacts",
            user_id = tracing::field::Empty,
            session_id = tracing::field::Empty,
            operation_id = "",
            operation_id_header = tracing::field::Empty,
            request_id = tracing::field::Empty,
            traceparent = tracing::field::Empty,
        );
        record_correlation(&span, &correlation);
        let _in_flight = self.in_flight();
        // The session the stream names, for the errorId of its refusal (connect §8.1).
        let named = std::sync::Mutex::new(None::<(String, String)>);
        let open = |first: &AddArtifactsRequest| {
            *named.lock().unwrap_or_else(PoisonError::into_inner) =
                Some((first.user_id().to_owned(), first.session_id.clone()));
            let session = self.session(
                first.user_id(),
                &first.session_id,
                first.client_observed_server_side_session_id.as_deref(),
            )?;
            // Room held by sessions that ended goes back before this upload counts.
            super::artifacts::sweep(self.inner.artifacts.as_ref(), &self.inner.manager);
            Ok(session.artifacts.session().clone())
        };
        let receive =
            super::artifacts::receive(request.into_inner(), self.inner.artifacts.as_ref(), open);
        let received = tracing::Instrument::instrument(receive, span.clone()).await;
        let _entered = span.enter();
        let error_id = |e: &ConnectError| {
            let named = named.lock().unwrap_or_else(PoisonError::into_inner);
            let (user_id, session_id) = named.as_ref()?;
            self.error_id(user_id, session_id, None, e)
        };
        received.map(tonic::Response::new).map_err(|e| match e {
            // The client's upload broke a rule (a name, a CRC, a hash, a limit, the
            // chunking): the client's mistake, logged at INFO whatever its condition.
            super::artifacts::Refused::Upload(e) => {
                self.inner.artifact_metrics.refused(&e);
                let e = ConnectError::from(e);
                tracing::info!(condition = logged_condition(&e), error = %e, "Spark Connect RPC error");
                status_with_error_id(&e, error_id(&e).as_deref())
            }
            super::artifacts::Refused::Rpc(e) => rpc_error(&e, error_id(&e).as_deref()),
        })
    }

    async fn artifact_status(
        &self,
        request: tonic::Request<ArtifactStatusesRequest>,
    ) -> Result<tonic::Response<ArtifactStatusesResponse>, tonic::Status> {
        let (metadata, request) = (request.metadata(), request.get_ref());
        let ids = (request.user_id(), request.session_id.as_str(), "");
        self.rpc("ArtifactStatus", ids, metadata, |_| {
            let session = self.session(
                request.user_id(),
                &request.session_id,
                request.client_observed_server_side_session_id.as_deref(),
            )?;
            let statuses = super::artifacts::statuses(&request.names, &session.artifacts);
            Ok(ArtifactStatusesResponse {
                session_id: session.session_id,
                server_side_session_id: session.server_side_session_id,
                statuses,
            })
        })
    }

    async fn config(
        &self,
        request: tonic::Request<ConfigRequest>,
    ) -> Result<tonic::Response<ConfigResponse>, tonic::Status> {
        let (metadata, _, request) = request.into_parts();
        let user_id = user_of(request.user_context.as_ref()).to_owned();
        let ids = (user_id.as_str(), request.session_id.as_str(), "");
        self.rpc("Config", ids, &metadata, |_| {
            let session = self.session(
                &user_id,
                &request.session_id,
                request.client_observed_server_side_session_id.as_deref(),
            )?;
            let operation = request.operation.and_then(|o| o.op_type);
            let (pairs, warnings) = self.conf_answer(&session, operation)?;
            Ok(ConfigResponse {
                session_id: session.session_id,
                pairs,
                warnings,
                server_side_session_id: session.server_side_session_id,
            })
        })
    }

    async fn fetch_error_details(
        &self,
        request: tonic::Request<FetchErrorDetailsRequest>,
    ) -> Result<tonic::Response<FetchErrorDetailsResponse>, tonic::Status> {
        let (metadata, request) = (request.metadata(), request.get_ref());
        let ids = (request.user_id(), request.session_id.as_str(), "");
        self.rpc("FetchErrorDetails", ids, metadata, |_| {
            super::error_details::fetch(&self.inner.manager, request)
        })
    }

    async fn analyze_plan(
        &self,
        request: tonic::Request<AnalyzePlanRequest>,
    ) -> Result<tonic::Response<AnalyzePlanResponse>, tonic::Status> {
        let (metadata, request) = (request.metadata(), request.get_ref());
        let user_id = user_of(request.user_context.as_ref());
        let ids = (user_id, request.session_id.as_str(), "");
        self.rpc("AnalyzePlan", ids, metadata, |_| {
            let session = self.session(
                user_id,
                &request.session_id,
                request.client_observed_server_side_session_id.as_deref(),
            )?;
            let result = self.inner.engine.analyze(&session, request)?;
            Ok(AnalyzePlanResponse {
                session_id: session.session_id,
                result: Some(result),
                server_side_session_id: session.server_side_session_id,
            })
        })
    }

    async fn clone_session(
        &self,
        request: tonic::Request<CloneSessionRequest>,
    ) -> Result<tonic::Response<CloneSessionResponse>, tonic::Status> {
        let (metadata, request) = (request.metadata(), request.get_ref());
        let ids = (request.user_id(), request.session_id.as_str(), "");
        self.rpc("CloneSession", ids, metadata, |_| {
            self.clone_session_rpc(request)
        })
    }

    async fn get_status(
        &self,
        request: tonic::Request<GetStatusRequest>,
    ) -> Result<tonic::Response<GetStatusResponse>, tonic::Status> {
        let (metadata, request) = (request.metadata(), request.get_ref());
        let ids = (request.user_id(), request.session_id.as_str(), "");
        self.rpc("GetStatus", ids, metadata, |_| self.get_status_rpc(request))
    }
}

/// The methods of Spark's `SparkConnectService` this service answers.
const SERVED: &[&str] = &[
    "ExecutePlan",
    "ReattachExecute",
    "ReleaseExecute",
    "Interrupt",
    "ReleaseSession",
    "Config",
    "AnalyzePlan",
    "FetchErrorDetails",
    "AddArtifacts",
    "ArtifactStatus",
    "CloneSession",
    "GetStatus",
];

/// [`ConnectService`] as a gRPC service (from [`ConnectService::into_service`], rx §1.1): a
/// `tower::Service` named `spark.connect.SparkConnectService`, for
/// `tonic::transport::Server::add_service`. A method it does not serve (one added after
/// Spark 4.3.0) gets `UNIMPLEMENTED` naming the method, as a gRPC server without the method
/// answers.
pub struct ConnectGrpcService<E> {
    inner:
        InterceptedService<SparkConnectServiceServer<ConnectService<E>>, super::auth::TokenCheck>,
}

impl<E> Clone for ConnectGrpcService<E> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<E> std::fmt::Debug for ConnectGrpcService<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConnectGrpcService")
    }
}

impl<E> tonic::server::NamedService for ConnectGrpcService<E> {
    const NAME: &'static str = super::SERVICE_NAME;
}

type HttpResponse = tonic::codegen::http::Response<tonic::body::Body>;

impl<E: QueryEngine> tower::Service<tonic::codegen::http::Request<tonic::body::Body>>
    for ConnectGrpcService<E>
{
    type Response = HttpResponse;
    type Error = std::convert::Infallible;
    type Future = futures::future::BoxFuture<'static, Result<HttpResponse, Self::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        tower::Service::<tonic::codegen::http::Request<tonic::body::Body>>::poll_ready(
            &mut self.inner,
            cx,
        )
    }

    fn call(&mut self, request: tonic::codegen::http::Request<tonic::body::Body>) -> Self::Future {
        let method = request
            .uri()
            .path()
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_owned();
        if !SERVED.contains(&method.as_str()) {
            let status = tonic::Status::unimplemented(format!(
                "Method {method} of {} is not implemented by this server",
                super::SERVICE_NAME
            ));
            return Box::pin(async move { Ok(status.into_http()) });
        }
        let call = tower::Service::call(&mut self.inner, request);
        Box::pin(async move {
            let response = call.await?;
            Ok(response.map(tonic::body::Body::new))
        })
    }
}

mod session_rpcs;
