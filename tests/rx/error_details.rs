//! FetchErrorDetails (connect §8): the errors a session's clients were sent with an
//! `errorId`, kept per session (bounded, the oldest evicted, freed with the session) and
//! answered once; in the manager on a manual clock, and over gRPC through
//! `ConnectService` with an engine that fails with a Spark condition and a cause.

use std::time::Duration;

use tether::execution::{ConnectError, ExecutionManager, ManagerConfig, SparkError};
use tether::wire::connect::FetchErrorDetailsRequest;
use tether_testing::connect::{self, Caller, ManualManager, OTHER_SESSION_ID, SESSION_ID, USER};

fn fetch(caller: &Caller, id: &str) -> FetchErrorDetailsRequest {
    let key = caller.session_key();
    FetchErrorDetailsRequest::new(key.session_id.to_string(), &*key.user_id, id)
}

fn error(n: u64) -> ConnectError {
    ConnectError::PositionNotAvailable {
        response_id: "r".into(),
        index: n,
    }
}

fn live(manager: &ExecutionManager, caller: &Caller) -> String {
    let key = caller.session_key();
    manager
        .get_or_create_session(&key.user_id, &key.session_id.to_string(), None)
        .unwrap()
}

/// An error stored in a live session is answered once; a session that does not exist (or
/// an id that is no UUID) gets no `errorId`, as Spark sends none without a session.
#[test]
fn a_live_sessions_error_is_answered_once() {
    let fx = ManualManager::default();
    let m = &fx.manager;
    let alice = Caller::default();
    assert_eq!(m.record_error(USER, SESSION_ID, None, &error(1)), None);
    assert_eq!(m.record_error(USER, "not-a-uuid", None, &error(1)), None);
    let server_side = live(m, &alice);
    let id = m.record_error(USER, SESSION_ID, None, &error(1)).unwrap();
    assert!(uuid::Uuid::try_parse(&id).is_ok(), "{id}");
    assert_eq!(m.stored_errors(&alice.session_key()), Some(1));
    let (answered_for, found) = m.take_error(&fetch(&alice, &id)).unwrap();
    assert_eq!(answered_for, server_side);
    assert_eq!(found, Some(error(1)));
    assert_eq!(m.take_error(&fetch(&alice, &id)).unwrap().1, None, "once");
    // Unknown ids of every kind: nothing, no error.
    for unknown in [
        uuid::Uuid::new_v4().to_string(),
        "nope".into(),
        String::new(),
    ] {
        assert_eq!(m.take_error(&fetch(&alice, &unknown)).unwrap().1, None);
    }
}

/// Another user's session with the same id, and another session of the same user, hold
/// their own errors (rx §5.6): an id of one names nothing in the other.
#[test]
fn an_error_belongs_to_its_session() {
    let fx = ManualManager::default();
    let m = &fx.manager;
    let (alice, mallory) = (Caller::default(), Caller::other_user());
    let elsewhere = Caller::new(USER, OTHER_SESSION_ID);
    for c in [&alice, &mallory, &elsewhere] {
        live(m, c);
    }
    let id = m.record_error(USER, SESSION_ID, None, &error(1)).unwrap();
    assert_eq!(m.take_error(&fetch(&mallory, &id)).unwrap().1, None);
    assert_eq!(m.take_error(&fetch(&elsewhere, &id)).unwrap().1, None);
    assert_eq!(m.take_error(&fetch(&alice, &id)).unwrap().1, Some(error(1)));
}

/// The store holds `error_details_per_session` errors, the oldest evicted first; 0 stores
/// none and sends no `errorId`.
#[test]
fn the_oldest_error_is_evicted() {
    let fx = ManualManager::new(ManagerConfig {
        error_details_per_session: 3,
        ..ManagerConfig::default()
    });
    let m = &fx.manager;
    let alice = Caller::default();
    live(m, &alice);
    let ids: Vec<String> = (0..5)
        .map(|n| m.record_error(USER, SESSION_ID, None, &error(n)).unwrap())
        .collect();
    assert_eq!(m.stored_errors(&alice.session_key()), Some(3));
    for (n, id) in ids.iter().enumerate() {
        let want = (n >= 2).then(|| error(n as u64));
        assert_eq!(
            m.take_error(&fetch(&alice, id)).unwrap().1,
            want,
            "error {n}"
        );
    }
    let none = ManualManager::new(ManagerConfig {
        error_details_per_session: 0,
        ..ManagerConfig::default()
    });
    live(&none.manager, &alice);
    assert_eq!(
        none.manager.record_error(USER, SESSION_ID, None, &error(1)),
        None
    );
}

/// A stored error can be fetched for `error_details_expiry` (Spark's 60 s).
#[test]
fn a_stored_error_expires() {
    let fx = ManualManager::default();
    let m = &fx.manager;
    let alice = Caller::default();
    live(m, &alice);
    let old = m.record_error(USER, SESSION_ID, None, &error(1)).unwrap();
    fx.clock.advance(Duration::from_secs(30));
    let young = m.record_error(USER, SESSION_ID, None, &error(2)).unwrap();
    fx.clock.advance(Duration::from_secs(30));
    assert_eq!(m.take_error(&fetch(&alice, &old)).unwrap().1, None);
    assert_eq!(
        m.take_error(&fetch(&alice, &young)).unwrap().1,
        Some(error(2))
    );
}

/// The errors go with their session: released (then `SESSION_CLOSED`, as Spark answers a
/// FetchErrorDetails in a closed session), released with `allow_reconnect` (the new session
/// starts empty), or expired by the maintenance pass.
#[test]
fn errors_are_freed_with_their_session() {
    let fx = ManualManager::default();
    let m = &fx.manager;
    let alice = Caller::default();
    live(m, &alice);
    let id = m.record_error(USER, SESSION_ID, None, &error(1)).unwrap();
    m.release_session(&alice.release_session(false));
    assert_eq!(m.stored_errors(&alice.session_key()), None);
    let closed = m.take_error(&fetch(&alice, &id)).unwrap_err();
    assert_eq!(connect::condition(&closed), "INVALID_HANDLE.SESSION_CLOSED");

    let bob = Caller::new("bob", SESSION_ID);
    live(m, &bob);
    let id = m.record_error("bob", SESSION_ID, None, &error(1)).unwrap();
    m.release_session(&bob.release_session(true));
    assert_eq!(m.take_error(&fetch(&bob, &id)).unwrap().1, None);
    assert_eq!(
        m.stored_errors(&bob.session_key()),
        Some(0),
        "a new session"
    );

    let carol = Caller::new("carol", SESSION_ID);
    live(m, &carol);
    m.record_error("carol", SESSION_ID, None, &error(1))
        .unwrap();
    fx.clock.advance(Duration::from_secs(61 * 60));
    m.maintain();
    assert_eq!(
        m.stored_errors(&carol.session_key()),
        None,
        "expired session"
    );
}

/// FetchErrorDetails gets or creates its session and checks it as every RPC does
/// (connect §3): a session id that is no UUID, a changed server-side session.
#[test]
fn fetching_checks_the_session() {
    let fx = ManualManager::default();
    let m = &fx.manager;
    let alice = Caller::default();
    let id = uuid::Uuid::new_v4().to_string();
    let (server_side, found) = m.take_error(&fetch(&alice, &id)).unwrap();
    assert_eq!(found, None);
    assert_eq!(live(m, &alice), server_side, "the session was created");
    let mut bad = fetch(&alice, &id);
    bad.session_id = "not-a-uuid".into();
    let e = m.take_error(&bad).unwrap_err();
    assert_eq!(connect::condition(&e), "INVALID_HANDLE.FORMAT");
    let mut changed = fetch(&alice, &id);
    changed.client_observed_server_side_session_id = Some(uuid::Uuid::new_v4().to_string());
    let e = m.take_error(&changed).unwrap_err();
    assert_eq!(connect::condition(&e), "INVALID_HANDLE.SESSION_CHANGED");
}

/// An execution's error delivered again (after a reattach) keeps its id while stored.
#[test]
fn a_redelivered_execution_error_keeps_its_id() {
    let fx = ManualManager::default();
    let m = &fx.manager;
    live(m, &Caller::default());
    let op = connect::op_id();
    let spark: ConnectError = SparkError::analysis("X", "x", "42000").into();
    let first = m.record_error(USER, SESSION_ID, Some(&op), &spark).unwrap();
    let again = m.record_error(USER, SESSION_ID, Some(&op), &spark).unwrap();
    assert_eq!(first, again);
    assert_eq!(m.stored_errors(&Caller::default().session_key()), Some(1));
}

// ---------------------------------------------------------------------------------------------
// Over gRPC
// ---------------------------------------------------------------------------------------------

#[cfg(feature = "spark-connect")]
mod grpc {
    use futures::StreamExt;
    use prost::Message;
    use tether::execution::{ConnectError, ExecutionManager, ManagerConfig, SparkError};
    use tether::spark::connect::{
        ConnectConfig, ConnectService, QueryEngine, ResponseSource, SessionContext,
    };
    use tether::wire::connect::{
        ConfigRequest, ExecutePlanRequest, ExecutePlanResponse, FetchErrorDetailsRequest,
        FetchErrorDetailsResponse, KeyValue, ReattachExecuteRequest, config_request,
    };
    use tether_testing::connect::{Caller, SESSION_ID, USER};
    use tokio::net::TcpListener;
    use tonic::codegen::http::uri::PathAndQuery;
    use tonic_types::StatusExt;

    /// Fails every execution after its first response with `DIVIDE_BY_ZERO` caused by a
    /// plain `IllegalArgumentException`.
    struct Failing;

    pub(super) fn divide_by_zero() -> SparkError {
        let mut e = SparkError::analysis("DIVIDE_BY_ZERO", "Division by zero.", "22012")
            .with_parameter("config", "\"spark.sql.ansi.enabled\"")
            .with_cause(SparkError::illegal_argument("the divisor was 0"));
        e.classes = [
            "org.apache.spark.SparkArithmeticException",
            "java.lang.ArithmeticException",
            "java.lang.RuntimeException",
            "java.lang.Exception",
            "java.lang.Throwable",
            "java.lang.Object",
        ]
        .map(str::to_owned)
        .to_vec();
        e
    }

    impl QueryEngine for Failing {
        fn execute(
            &self,
            _: &SessionContext,
            _: &ExecutePlanRequest,
        ) -> Result<ResponseSource, ConnectError> {
            let first = ExecutePlanResponse::arrow_batch(1, vec![0u8; 8]);
            Ok(futures::stream::iter([Ok(first), Err(divide_by_zero().into())]).boxed())
        }
    }

    struct Client {
        grpc: tonic::client::Grpc<tonic::transport::Channel>,
    }

    const SERVICE: &str = "/spark.connect.SparkConnectService/";

    impl Client {
        async fn connect(manager: ExecutionManager) -> Self {
            let service =
                ConnectService::new(manager, Failing).into_service(&ConnectConfig::default());
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let address = format!("http://{}", listener.local_addr().unwrap());
            tokio::spawn(
                tonic::transport::Server::builder()
                    .add_service(service)
                    .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
            );
            let channel = tonic::transport::Endpoint::from_shared(address)
                .unwrap()
                .connect()
                .await
                .unwrap();
            Self {
                grpc: tonic::client::Grpc::new(channel),
            }
        }

        async fn unary<Q, R>(&mut self, method: &str, request: Q) -> Result<R, tonic::Status>
        where
            Q: Message + Send + Sync + 'static,
            R: Message + Default + Send + Sync + 'static,
        {
            self.grpc.ready().await.unwrap();
            let path = PathAndQuery::try_from(format!("{SERVICE}{method}")).unwrap();
            let codec = tonic_prost::ProstCodec::<Q, R>::default();
            self.grpc
                .unary(tonic::Request::new(request), path, codec)
                .await
                .map(tonic::Response::into_inner)
        }

        /// Reads a response stream to its end: the responses and the status it ended with.
        async fn stream<Q>(
            &mut self,
            method: &str,
            request: Q,
        ) -> (Vec<ExecutePlanResponse>, Option<tonic::Status>)
        where
            Q: Message + Send + Sync + 'static,
        {
            self.grpc.ready().await.unwrap();
            let path = PathAndQuery::try_from(format!("{SERVICE}{method}")).unwrap();
            let codec = tonic_prost::ProstCodec::<Q, ExecutePlanResponse>::default();
            let mut stream = match self
                .grpc
                .server_streaming(tonic::Request::new(request), path, codec)
                .await
            {
                Ok(s) => s.into_inner(),
                Err(status) => return (Vec::new(), Some(status)),
            };
            let mut responses = Vec::new();
            loop {
                match stream.message().await {
                    Ok(Some(r)) => responses.push(r),
                    Ok(None) => return (responses, None),
                    Err(status) => return (responses, Some(status)),
                }
            }
        }

        async fn fetch(&mut self, id: &str) -> FetchErrorDetailsResponse {
            self.unary(
                "FetchErrorDetails",
                FetchErrorDetailsRequest::new(SESSION_ID, USER, id),
            )
            .await
            .unwrap()
        }

        async fn set(&mut self, key: &str, value: &str) {
            let set = config_request::Operation {
                op_type: Some(config_request::operation::OpType::Set(
                    config_request::Set {
                        pairs: vec![KeyValue::new(key, value)],
                        ..Default::default()
                    },
                )),
            };
            let request = ConfigRequest {
                session_id: SESSION_ID.into(),
                user_context: Caller::default().user_context(),
                operation: Some(set),
                ..Default::default()
            };
            let _: tether::wire::connect::ConfigResponse =
                self.unary("Config", request).await.unwrap();
        }
    }

    fn error_id(status: &tonic::Status) -> Option<String> {
        let details = status.check_error_details().unwrap();
        let info = details.error_info().expect("an ErrorInfo");
        info.metadata.get("errorId").cloned()
    }

    /// An engine's error on an execution's stream carries an `errorId`; FetchErrorDetails
    /// answers its chain once (condition, parameters, SQLSTATE, classes, the cause); the
    /// same error delivered again by a ReattachExecute carries the same id, and then the id
    /// is answered empty, as Spark 4.3.0 answers it (connect §8.1).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_execution_error_is_fetched_with_its_chain() {
        let mut client = Client::connect(ExecutionManager::new(ManagerConfig::default())).await;
        let op = tether_testing::connect::op_id();
        let request = Caller::default().execute_with(&op, true);
        let (responses, status) = client.stream("ExecutePlan", request).await;
        assert_eq!(responses.len(), 1);
        let status = status.expect("the execution's error");
        assert!(
            status.message().starts_with("[DIVIDE_BY_ZERO] "),
            "{status:?}"
        );
        let id = error_id(&status).expect("an errorId");
        // The error again, after a reattach: the same id.
        let reattach = ReattachExecuteRequest {
            last_response_id: Some(responses[0].response_id.clone()),
            ..Caller::default().reattach(&op, None)
        };
        let (_, again) = client.stream("ReattachExecute", reattach).await;
        assert_eq!(error_id(&again.expect("the error again")), Some(id.clone()));

        let details = client.fetch(&id).await;
        assert_eq!(details.root_error_idx, Some(0));
        assert_eq!(details.errors.len(), 2, "{details:?}");
        let (root, cause) = (&details.errors[0], &details.errors[1]);
        let want = divide_by_zero();
        assert_eq!(root.error_type_hierarchy, want.classes);
        assert_eq!(root.message, want.message());
        assert_eq!(root.cause_idx, Some(1));
        assert!(root.stack_trace.is_empty());
        let thrown = root.spark_throwable.as_ref().unwrap();
        assert_eq!(thrown.error_class.as_deref(), Some("DIVIDE_BY_ZERO"));
        assert_eq!(thrown.sql_state.as_deref(), Some("22012"));
        assert_eq!(thrown.message_parameters, want.parameters);
        assert_eq!(cause.message, "the divisor was 0");
        assert_eq!(cause.cause_idx, None);
        assert_eq!(cause.spark_throwable, None);
        assert_eq!(
            client.fetch(&id).await,
            FetchErrorDetailsResponse::default()
        );
    }

    /// An RPC's own error in a live session carries an `errorId` too; none without a live
    /// session (Spark's SESSION_NOT_FOUND carries none), none once the session's conf sets
    /// `spark.sql.connect.enrichError.enabled` to false; an unknown id is the empty answer.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rpc_errors_and_the_enrich_error_conf() {
        let mut client = Client::connect(ExecutionManager::new(ManagerConfig::default())).await;
        let unknown_session = ReattachExecuteRequest {
            session_id: uuid::Uuid::new_v4().to_string(),
            ..Caller::default().reattach(&tether_testing::connect::op_id(), None)
        };
        let (_, status) = client.stream("ReattachExecute", unknown_session).await;
        let status = status.unwrap();
        assert!(
            status
                .message()
                .starts_with("[INVALID_HANDLE.SESSION_NOT_FOUND]")
        );
        assert_eq!(error_id(&status), None);

        client.set("spark.sql.ansi.enabled", "true").await;
        let missing = Caller::default().reattach(&tether_testing::connect::op_id(), None);
        let (_, status) = client.stream("ReattachExecute", missing.clone()).await;
        let id = error_id(&status.unwrap()).expect("an errorId in a live session");
        let details = client.fetch(&id).await;
        let thrown = details.errors[0].spark_throwable.as_ref().unwrap();
        assert_eq!(
            thrown.error_class.as_deref(),
            Some("INVALID_HANDLE.OPERATION_NOT_FOUND")
        );
        assert_eq!(thrown.sql_state.as_deref(), Some("HY000"));
        assert!(thrown.message_parameters.contains_key("handle"));

        let unknown = client.fetch(&uuid::Uuid::new_v4().to_string()).await;
        assert_eq!(unknown, FetchErrorDetailsResponse::default());
        assert_eq!(unknown.encode_to_vec(), Vec::<u8>::new());

        client
            .set("spark.sql.connect.enrichError.enabled", "false")
            .await;
        let (_, status) = client.stream("ReattachExecute", missing).await;
        assert_eq!(error_id(&status.unwrap()), None);
    }
}
