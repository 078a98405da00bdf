//! The Spark Connect service and client over real gRPC on loopback (feature
//! `spark-connect`): tether's `ReattachingStream` over `ConnectClient` against
//! `ConnectService`, with stream rotation forcing reattaches (rx §4.3, §6), sessions and
//! server-side ids (connect §3), Spark's errors with their rich status (connect §2), and the
//! token (connect §4).
#![cfg(feature = "spark-connect")]

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tether::execution::client::{ClientConfig, ExecutionRpc, ReattachingStream};
use tether::execution::{ConnectError, ExecutionManager, ManagerConfig, StreamLimits};
use tether::spark::connect::{
    ConnectClient, ConnectConfig, ConnectService, QueryEngine, ResponseSource, SPARK_VERSION,
    SessionContext,
};
use tether::wire::connect::{
    AnalyzePlanRequest, ConfigRequest, ExecutePlanRequest, ExecutePlanResponse, InterruptType,
    KeyValue, Plan, analyze_plan_request, analyze_plan_response, config_request,
};
use tether_testing::connect::{Caller, SESSION_ID};
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;

/// Interprets a plan whose root bytes are a decimal row count: one batch per row, whose
/// data is the row number; `fail` fails after the rows.
pub(crate) struct Counting;

impl QueryEngine for Counting {
    fn execute(
        &self,
        _session: &SessionContext,
        request: &ExecutePlanRequest,
    ) -> Result<ResponseSource, ConnectError> {
        let Some(Plan {
            op_type: Some(tether::wire::connect::plan::OpType::Root(root)),
        }) = &request.plan
        else {
            return Err(ConnectError::Failed {
                message: "[CONNECT_INVALID_PLAN] no root".into(),
                code: tether::execution::Code::Internal,
            });
        };
        let text = String::from_utf8_lossy(root).into_owned();
        let (rows, fail) = match text.strip_suffix(" fail") {
            Some(n) => (n.parse::<u64>().unwrap(), true),
            None => (text.parse::<u64>().unwrap(), false),
        };
        let batches = futures::stream::iter(0..rows).map(|i| {
            Ok(ExecutePlanResponse::arrow_batch(
                1,
                i.to_be_bytes().to_vec(),
            ))
        });
        let tail = futures::stream::iter(fail.then(|| {
            Err(ConnectError::Failed {
                message: "[DIVIDE_BY_ZERO] Division by zero. SQLSTATE: 22012".into(),
                code: tether::execution::Code::Internal,
            })
        }));
        Ok(batches.chain(tail).boxed())
    }
}

struct Server {
    address: String,
    manager: ExecutionManager,
}

async fn serve(limits: StreamLimits, token: Option<&str>) -> Server {
    let config = ManagerConfig {
        stream: limits,
        ..ManagerConfig::default()
    };
    let manager = ExecutionManager::new(config);
    let service = ConnectService::new(manager.clone(), Counting).into_service(&ConnectConfig {
        token: token.map(str::to_owned),
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(TcpIncoming::from(listener).with_nodelay(Some(true))),
    );
    Server { address, manager }
}

async fn read_all(
    client: ConnectClient,
    plan: &str,
) -> (
    Vec<u64>,
    Option<tether::execution::client::ClientError>,
    u64,
) {
    let mut stream = ReattachingStream::new(
        Arc::new(client),
        Caller::default().plan(plan.as_bytes().to_vec()),
        ClientConfig::default(),
    )
    .unwrap();
    let mut rows = Vec::new();
    let mut error = None;
    while let Some(item) = stream.next().await {
        match item {
            Ok(r) => {
                if let Some(
                    tether::wire::connect::execute_plan_response::ResponseType::ArrowBatch(b),
                ) = r.response_type
                {
                    rows.push(u64::from_be_bytes(b.data[..8].try_into().unwrap()));
                }
            }
            Err(e) => {
                error = Some(e);
                break;
            }
        }
    }
    let reattaches = stream.stats().reattaches;
    let _ = stream.close().await;
    (rows, error, reattaches)
}

async fn eventually_empty(manager: &ExecutionManager) {
    for _ in 0..200 {
        if manager.execution_count() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{} executions left", manager.execution_count());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_arrives_once_in_order_across_rotated_streams() {
    let server = serve(
        StreamLimits {
            max_duration: Some(Duration::from_secs(1)),
            max_bytes: Some(123),
        },
        None,
    )
    .await;
    let client = ConnectClient::connect(&server.address, None).await.unwrap();
    let (rows, error, reattaches) = read_all(client, "2000").await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(rows, (0..2000).collect::<Vec<_>>());
    assert!(
        reattaches > 100,
        "rotation every 123 bytes: {reattaches} reattaches"
    );
    eventually_empty(&server.manager).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_error_reaches_the_client_after_the_rows() {
    let server = serve(StreamLimits::default(), None).await;
    let client = ConnectClient::connect(&server.address, None).await.unwrap();
    let (rows, error, _) = read_all(client, "5 fail").await;
    assert_eq!(rows, vec![0, 1, 2, 3, 4]);
    let error = error.expect("the engine's error");
    assert!(error.to_string().contains("DIVIDE_BY_ZERO"), "{error}");
    eventually_empty(&server.manager).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_response_carries_the_sessions_one_server_side_id() {
    let server = serve(StreamLimits::default(), None).await;
    let client = ConnectClient::connect(&server.address, None).await.unwrap();
    let user = Caller::default().user_context();
    let config = client
        .config(ConfigRequest {
            session_id: SESSION_ID.into(),
            user_context: user.clone(),
            operation: Some(config_request::Operation {
                op_type: Some(config_request::operation::OpType::Get(
                    config_request::Get {
                        keys: vec!["spark.sql.session.timeZone".into()],
                    },
                )),
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(config.session_id, SESSION_ID);
    assert_eq!(
        config.pairs,
        vec![KeyValue::new("spark.sql.session.timeZone", "Etc/UTC")]
    );
    let server_side = config.server_side_session_id.clone();
    assert!(!server_side.is_empty());

    let version = client
        .analyze_plan(AnalyzePlanRequest {
            session_id: SESSION_ID.into(),
            user_context: user.clone(),
            analyze: Some(analyze_plan_request::Analyze::SparkVersion(
                analyze_plan_request::SparkVersion {},
            )),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(version.server_side_session_id, server_side);
    assert_eq!(
        version.result,
        Some(analyze_plan_response::Result::SparkVersion(
            analyze_plan_response::SparkVersion {
                version: SPARK_VERSION.into()
            }
        ))
    );

    let mut responses = client
        .execute_plan(Caller::default().plan("3"))
        .await
        .unwrap();
    while let Some(r) = responses.next().await {
        let r = r.unwrap();
        assert_eq!(r.server_side_session_id, server_side);
        assert_eq!(r.session_id, SESSION_ID);
    }

    // An unknown key is Spark's SQL_CONF_NOT_FOUND.
    let missing = client
        .config(ConfigRequest {
            session_id: SESSION_ID.into(),
            user_context: user,
            operation: Some(config_request::Operation {
                op_type: Some(config_request::operation::OpType::Get(
                    config_request::Get {
                        keys: vec!["no.such.key".into()],
                    },
                )),
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(
        missing.message().starts_with("[SQL_CONF_NOT_FOUND]"),
        "{missing}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_carry_sparks_condition_in_the_rich_status() {
    let server = serve(StreamLimits::default(), None).await;
    let client = ConnectClient::connect(&server.address, None).await.unwrap();
    let reattach = Caller::default().reattach("8a2f6c1e-0c5e-4b7e-9a4f-2d3c4b5a6978", None);
    // No session yet: SESSION_NOT_FOUND (ReattachExecute never creates one, rx §5.5).
    let Err(e) = client.reattach_execute(reattach.clone()).await else {
        panic!("a reattach without a session must fail");
    };
    assert_eq!(e.condition(), Some("INVALID_HANDLE.SESSION_NOT_FOUND"));
    assert_eq!(e.code(), tether::execution::Code::Internal);
    // Interrupt gets or creates the session and interrupts nothing (connect §3).
    let interrupted = client
        .interrupt(Caller::default().interrupt(InterruptType::All, None))
        .await
        .unwrap();
    assert!(interrupted.interrupted_ids.is_empty());
    // Now the session exists: the unknown operation is OPERATION_NOT_FOUND.
    let Err(e) = client.reattach_execute(reattach).await else {
        panic!("a reattach of an unknown operation must fail");
    };
    assert_eq!(e.condition(), Some("INVALID_HANDLE.OPERATION_NOT_FOUND"));
    assert!(e.message().ends_with("SQLSTATE: HY000"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_is_required_and_checked() {
    let server = serve(StreamLimits::default(), Some("s3cret")).await;
    for (token, message) in [
        (None, "No authentication token provided"),
        (Some("wrong"), "Invalid authentication token"),
    ] {
        let client = ConnectClient::connect(&server.address, token)
            .await
            .unwrap();
        let Err(e) = client.execute_plan(Caller::default().plan("1")).await else {
            panic!("an unauthenticated call must fail");
        };
        assert_eq!(e.code(), tether::execution::Code::Unauthenticated);
        assert_eq!(e.message(), message);
    }
    let client = ConnectClient::connect(&server.address, Some("s3cret"))
        .await
        .unwrap();
    let (rows, error, _) = read_all(client, "3").await;
    assert!(error.is_none());
    assert_eq!(rows, vec![0, 1, 2]);
}

/// A client's extra headers reach the server on every RPC, with the token (connect §3: what
/// PySpark does with each extra `;key=value`; a proxy routes on such a header,
/// docs/deployment.md §1). The server here is a proxy's stand-in: it refuses any RPC
/// without the routing header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extra_headers_travel_on_every_rpc() {
    const ROUTE: &str = "x-spark-connect-session-id";
    let manager = ExecutionManager::new(ManagerConfig::default());
    let service = ConnectService::new(manager, Counting).into_service(&ConnectConfig {
        token: Some("s3cret".into()),
    });
    let routed = tonic::service::interceptor::InterceptedService::new(
        service,
        |request: tonic::Request<()>| match request.metadata().get(ROUTE) {
            Some(v) if v == SESSION_ID => Ok(request),
            other => Err(tonic::Status::unavailable(format!(
                "no route for {other:?}"
            ))),
        },
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(routed)
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    let plain = ConnectClient::connect(&address, Some("s3cret"))
        .await
        .unwrap();
    let Err(e) = plain.execute_plan(Caller::default().plan("1")).await else {
        panic!("the stand-in proxy must refuse a call without the header");
    };
    assert!(e.message().starts_with("no route for None"), "{e}");
    let client = plain.with_header(ROUTE, SESSION_ID).unwrap();
    let (rows, error, _) = read_all(client.clone(), "3").await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(rows, vec![0, 1, 2]);
    // Names a client must not set, and values a header cannot carry.
    for (name, value) in [
        ("authorization", "Bearer x"),
        ("grpc-timeout", "1S"),
        ("X-Upper", "v"),
        ("key-bin", "v"),
        ("bad name", "v"),
        ("connection", "close"),
        ("transfer-encoding", "chunked"),
        ("host", "evil.example"),
        (ROUTE, "line\nbreak"),
        (ROUTE, ""),
        (ROUTE, " padded "),
        (ROUTE, "tab\there"),
        (ROUTE, "caf\u{e9}"),
    ] {
        let e = client.with_header(name, value).unwrap_err();
        assert!(
            e.to_string()
                .starts_with(&format!("the header {name:?} cannot be sent: ")),
            "{e}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn methods_not_served_answer_unimplemented_by_name() {
    let server = serve(StreamLimits::default(), None).await;
    let channel = tonic::transport::Endpoint::from_shared(server.address.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let codec = tonic_prost::ProstCodec::<ConfigRequest, ConfigRequest>::default();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/spark.connect.SparkConnectService/NoSuchMethod",
    );
    let status = grpc
        .unary(tonic::Request::new(ConfigRequest::default()), path, codec)
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unimplemented);
    assert_eq!(
        status.message(),
        "Method NoSuchMethod of spark.connect.SparkConnectService is not implemented by this server"
    );
}
