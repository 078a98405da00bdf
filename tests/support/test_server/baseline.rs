//! `--baseline bare` and `--baseline bare-rotating`: the benchmark's baseline
//! (`scripts/bench-connect.sh`), the same query engine served by plain tonic with none of
//! tether's logic — no [`ExecutionManager`](tether::execution::ExecutionManager), no
//! response log, no retry buffer, no sessions.
//!
//! - ExecutePlan runs the engine ([`QueryEngine::execute`], so it computes exactly the
//!   batches the tether server computes, rows per batch included), stamps the ids on each
//!   response (a fresh UUID as `response_id`) and appends `ResultComplete`.
//! - `bare-rotating` ends every response stream after one response, as tether's and Spark's
//!   rotation by a 123-byte budget does; a ReattachExecute continues with the operation's
//!   next response, whatever `last_response_id` says (no retry buffer: a lost response is
//!   lost). This is the floor a reattaching client's own cost sets for a rotating server.
//! - ReleaseExecute, Interrupt and ReleaseSession answer OK and do nothing else; Config
//!   answers from [`QueryEngine::default_conf`]; AnalyzePlan asks the engine.
//!
//! Not a Spark Connect server anyone should run: it exists to be measured against.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use tether::execution::{ConnectError, SparkError};
use tether::spark::connect::{
    ArtifactSession, MemoryArtifactStore, QueryEngine, ResponseSource, SessionArtifacts,
    SessionContext, to_status,
};
use tether::wire::connect::{
    AnalyzePlanRequest, AnalyzePlanResponse, ConfigRequest, ConfigResponse, ExecutePlanRequest,
    ExecutePlanResponse, InterruptRequest, InterruptResponse, KeyValue, ReattachExecuteRequest,
    ReleaseExecuteRequest, ReleaseExecuteResponse, ReleaseSessionRequest, ReleaseSessionResponse,
    config_request, execute_plan_response,
};
use tonic::body::Body;
use tonic::codegen::http;
use tonic::{Request, Response, Status};
use tonic_prost::ProstCodec;

/// One operation's responses still to send.
struct Operation {
    source: ResponseSource,
    session: SessionContext,
    operation_id: String,
    completed: bool,
}

type Shared = Arc<tokio::sync::Mutex<Operation>>;

struct Inner<E> {
    engine: E,
    rotate: bool,
    server_side_session_id: String,
    operations: Mutex<HashMap<String, Shared>>,
}

/// The bare baseline service (module docs).
pub struct Bare<E> {
    inner: Arc<Inner<E>>,
}

impl<E> Clone for Bare<E> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<E> tonic::server::NamedService for Bare<E> {
    const NAME: &'static str = tether::spark::connect::SERVICE_NAME;
}

impl<E: QueryEngine> Bare<E> {
    pub fn new(engine: E, rotate: bool) -> Self {
        Self {
            inner: Arc::new(Inner {
                engine,
                rotate,
                server_side_session_id: uuid::Uuid::new_v4().to_string(),
                operations: Mutex::new(HashMap::new()),
            }),
        }
    }

    fn context(&self, user_id: &str, session_id: &str) -> SessionContext {
        let server_side_session_id = self.inner.server_side_session_id.clone();
        // The bare baseline takes no uploads: its sessions have no artifacts.
        let artifacts = SessionArtifacts::new(
            Arc::new(MemoryArtifactStore::default()),
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

    fn operations(&self) -> std::sync::MutexGuard<'_, HashMap<String, Shared>> {
        self.inner
            .operations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The responses of one stream of `operation`: the next one (rotating) or all.
    fn stream(&self, operation: Shared) -> Responses {
        let this = self.clone();
        let limit = if self.inner.rotate { 1 } else { usize::MAX };
        futures::stream::unfold(Some(0usize), move |sent| {
            let (this, operation) = (this.clone(), operation.clone());
            async move {
                let sent = sent.filter(|n| *n < limit)?;
                let mut op = operation.lock().await;
                if op.completed {
                    return None;
                }
                let item = match op.source.next().await {
                    Some(Ok(response)) => Ok(response),
                    Some(Err(e)) => Err(e),
                    None => {
                        op.completed = true;
                        this.operations().remove(&op.operation_id);
                        Ok(ExecutePlanResponse {
                            response_type: Some(
                                execute_plan_response::ResponseType::ResultComplete(
                                    execute_plan_response::ResultComplete {},
                                ),
                            ),
                            ..ExecutePlanResponse::default()
                        })
                    }
                };
                match item {
                    Ok(mut response) => {
                        response.session_id = op.session.session_id.clone();
                        response.server_side_session_id = op.session.server_side_session_id.clone();
                        response.operation_id = op.operation_id.clone();
                        response.response_id = uuid::Uuid::new_v4().to_string();
                        Some((Ok(response), Some(sent + 1)))
                    }
                    Err(e) => {
                        op.completed = true;
                        this.operations().remove(&op.operation_id);
                        Some((Err(to_status(&e)), None))
                    }
                }
            }
        })
        .boxed()
    }

    fn execute_plan(&self, request: &ExecutePlanRequest) -> Result<Shared, Status> {
        let session = self.context(request.user_id(), &request.session_id);
        let source = self
            .inner
            .engine
            .execute(&session, request)
            .map_err(|e| to_status(&e))?;
        let operation_id = request
            .operation_id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let operation = Arc::new(tokio::sync::Mutex::new(Operation {
            source,
            session,
            operation_id: operation_id.clone(),
            completed: false,
        }));
        self.operations().insert(operation_id, operation.clone());
        Ok(operation)
    }

    fn config(&self, request: ConfigRequest) -> Result<ConfigResponse, Status> {
        use config_request::operation::OpType;
        let engine = &self.inner.engine;
        let mut pairs = Vec::new();
        match request.operation.and_then(|o| o.op_type) {
            Some(OpType::Get(get)) => {
                for key in get.keys {
                    let value = engine.default_conf(&key).ok_or_else(|| {
                        to_status(&ConnectError::from(SparkError::sql_conf_not_found(&key)))
                    })?;
                    pairs.push(KeyValue::new(key, value));
                }
            }
            Some(OpType::GetWithDefault(g)) => pairs.extend(g.pairs),
            Some(OpType::GetOption(g)) => {
                for key in g.keys {
                    let value = engine.default_conf(&key);
                    pairs.push(KeyValue { key, value });
                }
            }
            Some(OpType::IsModifiable(m)) => {
                pairs.extend(m.keys.into_iter().map(|k| KeyValue::new(k, "true")));
            }
            _ => {}
        }
        Ok(ConfigResponse {
            session_id: request.session_id,
            pairs,
            warnings: Vec::new(),
            server_side_session_id: self.inner.server_side_session_id.clone(),
        })
    }
}

type HttpRequest = http::Request<Body>;
type HttpResponse = http::Response<Body>;

fn grpc<Resp, Req>() -> tonic::server::Grpc<ProstCodec<Resp, Req>>
where
    Resp: prost::Message + Send + 'static,
    Req: prost::Message + Default + Send + 'static,
{
    tonic::server::Grpc::new(ProstCodec::default())
        .max_decoding_message_size(tether::spark::connect::MAX_MESSAGE_SIZE)
        .max_encoding_message_size(tether::spark::connect::MAX_MESSAGE_SIZE)
}

/// A unary method as a tower service.
fn unary<Req, Resp, F>(
    f: F,
) -> impl tower::Service<
    Request<Req>,
    Response = Response<Resp>,
    Error = Status,
    Future = futures::future::Ready<Result<Response<Resp>, Status>>,
> + Send
where
    F: Fn(Req) -> Result<Resp, Status> + Send,
{
    tower::service_fn(move |request: Request<Req>| {
        futures::future::ready(f(request.into_inner()).map(Response::new))
    })
}

/// The responses of one ExecutePlan or ReattachExecute stream.
type Responses = BoxStream<'static, Result<ExecutePlanResponse, Status>>;

/// A server-streaming method as a tower service.
fn streaming<Req, F>(
    f: F,
) -> impl tower::Service<
    Request<Req>,
    Response = Response<Responses>,
    Error = Status,
    Future = futures::future::Ready<Result<Response<Responses>, Status>>,
> + Send
where
    F: Fn(Req) -> Result<Responses, Status> + Send,
{
    tower::service_fn(move |request: Request<Req>| {
        futures::future::ready(f(request.into_inner()).map(Response::new))
    })
}

impl<E: QueryEngine> tower::Service<HttpRequest> for Bare<E> {
    type Response = HttpResponse;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<'static, Result<HttpResponse, Self::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: HttpRequest) -> Self::Future {
        let this = self.clone();
        let method = request
            .uri()
            .path()
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_owned();
        match method.as_str() {
            "ExecutePlan" => Box::pin(async move {
                let s = this.clone();
                let svc = streaming(move |r: ExecutePlanRequest| Ok(s.stream(s.execute_plan(&r)?)));
                Ok(grpc().server_streaming(svc, request).await)
            }),
            "ReattachExecute" => Box::pin(async move {
                let s = this.clone();
                let svc = streaming(move |r: ReattachExecuteRequest| {
                    let operation = s.operations().get(&r.operation_id).cloned();
                    let operation = operation.ok_or_else(|| {
                        to_status(&ConnectError::OperationNotFound {
                            handle: r.operation_id.clone(),
                        })
                    })?;
                    Ok(s.stream(operation))
                });
                Ok(grpc().server_streaming(svc, request).await)
            }),
            "ReleaseExecute" => Box::pin(async move {
                let svc = unary(move |r: ReleaseExecuteRequest| {
                    Ok(ReleaseExecuteResponse {
                        session_id: r.session_id,
                        server_side_session_id: this.inner.server_side_session_id.clone(),
                        operation_id: Some(r.operation_id),
                    })
                });
                Ok(grpc().unary(svc, request).await)
            }),
            "Config" => Box::pin(async move {
                let svc = unary(move |r: ConfigRequest| this.config(r));
                Ok(grpc().unary(svc, request).await)
            }),
            "AnalyzePlan" => Box::pin(async move {
                let svc = unary(move |r: AnalyzePlanRequest| {
                    let session = this.context(
                        r.user_context.as_ref().map_or("", |u| u.user_id.as_str()),
                        &r.session_id,
                    );
                    let result = this
                        .inner
                        .engine
                        .analyze(&session, &r)
                        .map_err(|e| to_status(&e))?;
                    Ok(AnalyzePlanResponse {
                        session_id: r.session_id,
                        result: Some(result),
                        server_side_session_id: session.server_side_session_id,
                    })
                });
                Ok(grpc().unary(svc, request).await)
            }),
            "Interrupt" => Box::pin(async move {
                let svc = unary(move |r: InterruptRequest| {
                    Ok(InterruptResponse {
                        session_id: r.session_id,
                        interrupted_ids: Vec::new(),
                        server_side_session_id: this.inner.server_side_session_id.clone(),
                    })
                });
                Ok(grpc().unary(svc, request).await)
            }),
            "ReleaseSession" => Box::pin(async move {
                let svc = unary(move |r: ReleaseSessionRequest| {
                    Ok(ReleaseSessionResponse {
                        session_id: r.session_id,
                        server_side_session_id: this.inner.server_side_session_id.clone(),
                    })
                });
                Ok(grpc().unary(svc, request).await)
            }),
            other => {
                let status = Status::unimplemented(format!("{other} is not served"));
                Box::pin(async move { Ok(status.into_http()) })
            }
        }
    }
}
