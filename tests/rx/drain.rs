//! Graceful drain of an execution manager (tether's own; docs/deployment.md): new sessions
//! and executions are refused with the retryable `SERVER_DRAINING`, everything live is
//! served as before, and `cancel_all` ends what a deadline leaves with Spark's
//! `OPERATION_CANCELED`, right after the responses already sent.

use tether::execution::{Code, ConnectError, ConsumerEvent, ProduceError, condition};
use tether_testing::connect::{
    Caller, ManualManager, batch, drain, expect_err, next, op_id, push_n, rows, start,
};

/// A manager with one running execution of `c`, draining; its producer and stream.
fn draining_with_one(
    c: &Caller,
    op: &str,
) -> (
    ManualManager,
    tether::execution::Producer,
    tether::execution::ResponseStream,
) {
    let f = ManualManager::default();
    let (p, s) = start(&f.manager, &c.execute(op));
    assert!(!f.manager.is_draining());
    f.manager.refuse_new();
    assert!(f.manager.is_draining());
    (f, p, s)
}

#[test]
fn a_draining_manager_refuses_new_sessions_with_a_retryable_status() {
    let c = Caller::default();
    let (f, _p, _s) = draining_with_one(&c, &op_id());
    let stranger = Caller::new("other", &uuid::Uuid::new_v4().to_string());
    let err = f
        .manager
        .execute_plan(&stranger.execute(&op_id()))
        .expect_err("a new session while draining is refused");
    assert_eq!(err, ConnectError::ServerDraining);
    assert_eq!(err.condition(), Some("SERVER_DRAINING"));
    assert_eq!(
        err.code(),
        Code::Unavailable,
        "UNAVAILABLE: clients retry it"
    );
    assert!(
        err.message()
            .starts_with("[SERVER_DRAINING] The server is draining"),
        "{}",
        err.message()
    );
    assert_eq!(
        condition::Condition::find_in(&err.message()),
        Some(condition::SERVER_DRAINING)
    );
    // No RPC creates the session: not an Interrupt, not a Config-style session lookup.
    assert_eq!(
        f.manager.interrupt(&stranger.interrupt_op(&op_id())).err(),
        Some(ConnectError::ServerDraining)
    );
    let sid = stranger.session_key().session_id.to_string();
    assert_eq!(
        f.manager.get_or_create_session("other", &sid, None).err(),
        Some(ConnectError::ServerDraining)
    );
    assert_eq!(f.manager.stats().sessions, 1, "only the live session");
}

#[test]
fn a_draining_manager_refuses_new_executions_in_live_sessions() {
    let c = Caller::default();
    let (f, _p, _s) = draining_with_one(&c, &op_id());
    let created = f.manager.stats().created;
    assert_eq!(
        f.manager.execute_plan(&c.execute(&op_id())).err(),
        Some(ConnectError::ServerDraining)
    );
    assert_eq!(f.manager.stats().created, created, "nothing registered");
    assert_eq!(f.manager.execution_count(), 1);
}

#[test]
fn a_draining_manager_serves_live_executions_to_their_end() {
    let c = Caller::default();
    let op = op_id();
    let (f, mut p, mut s) = draining_with_one(&c, &op);
    push_n(&mut p, 1, 2);
    let first = next(&mut s);
    assert_eq!(rows(&first), Some(1));
    // ReleaseUntil, ReattachExecute (preempting the stream) and a repeated ExecutePlan of the
    // live operation all work while draining.
    f.manager
        .release_execute(&c.release_until(&op, &first.response_id))
        .expect("ReleaseUntil while draining");
    let mut s2 = f
        .manager
        .reattach_execute(&c.reattach(&op, Some(&first.response_id)))
        .expect("ReattachExecute while draining");
    assert_eq!(expect_err(&mut s), ConnectError::Disconnected);
    assert_eq!(rows(&next(&mut s2)), Some(2));
    push_n(&mut p, 3, 1);
    p.finish().unwrap();
    let (rest, end) = drain(&mut s2);
    assert_eq!(rest.iter().map(rows).collect::<Vec<_>>(), [Some(3), None]);
    assert!(rest[1].is_result_complete(), "{rest:?}");
    assert!(matches!(end, ConsumerEvent::End(_)), "{end:?}");
    f.manager.release_execute(&c.release_all(&op)).unwrap();
    assert_eq!(f.manager.execution_count(), 0, "the drain's wait ends here");
    let stats = f.manager.stats();
    assert_eq!((stats.created, stats.released), (1, 1));
}

#[test]
fn cancel_all_cancels_ahead_of_unsent_responses_even_what_was_all_handed_out() {
    let f = ManualManager::new(tether::execution::ManagerConfig {
        memory_budget: Some(1 << 20),
        ..Default::default()
    });
    let c = Caller::default();
    let other = Caller::new("u2", &uuid::Uuid::new_v4().to_string());
    let third = Caller::new("u3", &uuid::Uuid::new_v4().to_string());
    let (running, unread, sent, failed) = (op_id(), op_id(), op_id(), op_id());
    // Still producing: 3 responses, 1 sent.
    let (mut p_run, mut s_run) = start(&f.manager, &c.execute(&running));
    push_n(&mut p_run, 1, 3);
    let first = next(&mut s_run);
    // Finished, 2 responses and ResultComplete, none sent.
    let (mut p_unread, mut s_unread) = start(&f.manager, &other.execute(&unread));
    push_n(&mut p_unread, 1, 2);
    p_unread.finish().unwrap();
    // Finished and every response handed out (only the end of the stream is left).
    let (mut p_sent, mut s_sent) = start(&f.manager, &third.execute(&sent));
    push_n(&mut p_sent, 1, 1);
    p_sent.finish().unwrap();
    assert_eq!(rows(&next(&mut s_sent)), Some(1));
    assert!(next(&mut s_sent).is_result_complete());
    // Failed with its own error behind an unsent response.
    let (mut p_failed, mut s_failed) = start(&f.manager, &c.execute(&failed));
    push_n(&mut p_failed, 1, 1);
    let query_error = ConnectError::Failed {
        message: "the query failed".into(),
        code: Code::Internal,
    };
    p_failed.fail(query_error.clone()).unwrap();
    let held = f.manager.memory_usage().expect("a budget").used;

    f.manager.refuse_new();
    let mut canceled = f.manager.cancel_all();
    canceled.sort_by_key(|k| k.operation_id);
    let mut expected = vec![
        c.key(&running),
        other.key(&unread),
        third.key(&sent),
        c.key(&failed),
    ];
    expected.sort_by_key(|k| k.operation_id);
    assert_eq!(
        canceled, expected,
        "every one: handed out is not read (a client's buffers may hold it all)"
    );

    // The error comes next, ahead of what was unsent, which is gone.
    assert_eq!(expect_err(&mut s_run), ConnectError::OperationCanceled);
    assert!(p_run.is_cancelled());
    assert_eq!(p_run.try_push(batch(4)), Err(ProduceError::Cancelled));
    assert_eq!(expect_err(&mut s_unread), ConnectError::OperationCanceled);
    assert_eq!(
        expect_err(&mut s_failed),
        query_error,
        "a failed execution keeps its own error"
    );
    // A client reattaching, from its last response or from the start, gets the same error
    // at once (nothing is re-sent).
    for last in [Some(first.response_id.as_str()), None] {
        let mut again = f
            .manager
            .reattach_execute(&c.reattach(&running, last))
            .expect("the execution stays registered until released");
        assert_eq!(expect_err(&mut again), ConnectError::OperationCanceled);
    }
    let after = f.manager.memory_usage().expect("a budget").used;
    assert!(
        after < held,
        "dropped responses return their bytes: {after} < {held}"
    );
    // The one handed out to its end gets the error instead of its end.
    assert_eq!(expect_err(&mut s_sent), ConnectError::OperationCanceled);
    // Canceling again cancels nothing; all stay registered until released.
    assert!(f.manager.cancel_all().is_empty());
    assert_eq!(f.manager.execution_count(), 4);
    for (caller, op) in [
        (&c, &running),
        (&other, &unread),
        (&third, &sent),
        (&c, &failed),
    ] {
        f.manager.release_execute(&caller.release_all(op)).unwrap();
    }
    assert_eq!(f.manager.execution_count(), 0);
}

#[test]
fn abandon_detached_abandons_only_what_no_client_is_attached_to() {
    let f = ManualManager::default();
    let c = Caller::default();
    let (attached, detached) = (op_id(), op_id());
    let (_p1, mut s1) = start(&f.manager, &c.execute(&attached));
    let (_p2, s2) = start(&f.manager, &c.execute(&detached));
    drop(s2); // the client went away (rx §2.2 T4)
    // Detached for no time at all: still abandoned (no detached_timeout, rx §5.3).
    assert_eq!(
        f.manager.abandon_detached(std::time::Duration::ZERO, true),
        vec![c.key(&detached)]
    );
    assert!(f.manager.is_abandoned(&c.key(&detached)), "tombstoned");
    assert_eq!(f.manager.stats().abandoned, 1);
    assert_eq!(f.manager.execution_keys(), vec![c.key(&attached)]);
    assert!(
        f.manager
            .abandon_detached(std::time::Duration::ZERO, true)
            .is_empty()
    );
    // The attached one is untouched.
    assert!(matches!(s1.try_next(), ConsumerEvent::Pending { .. }));
}

#[test]
fn an_execute_plan_repeating_a_live_operation_reattaches_while_draining() {
    let c = Caller::default();
    let op = op_id();
    let (f, mut p, mut s) = draining_with_one(&c, &op);
    push_n(&mut p, 1, 1);
    let submitted = f
        .manager
        .execute_plan(&c.execute(&op))
        .expect("a duplicate");
    let mut again = match submitted {
        tether::execution::Submitted::Reattached(stream) => *stream,
        other => panic!("rx §5.5: a repeat of a live operation reattaches, got {other:?}"),
    };
    assert_eq!(expect_err(&mut s), ConnectError::Disconnected);
    assert_eq!(rows(&next(&mut again)), Some(1));
}

// ---------------------------------------------------------------------------------------------
// ConnectService::drain over gRPC
// ---------------------------------------------------------------------------------------------

/// A client that has not read its `OPERATION_CANCELED` when the grace after the deadline
/// ends (still reading what it held) is abandoned and reported `untold`; one that read it is
/// not, and a longer grace (`Drain::with_grace`) waits for the slow one.
#[test]
fn a_canceled_execution_abandoned_before_its_client_read_the_error_is_untold() {
    use std::time::Duration;
    use tether::execution::{DRAIN_GRACE, DrainStep};
    let f = ManualManager::default();
    let c = Caller::default();
    let (told, slow) = (op_id(), op_id());
    let (mut p1, mut s1) = start(&f.manager, &c.execute(&told));
    let (mut p2, mut s2) = start(&f.manager, &c.execute(&slow));
    push_n(&mut p1, 1, 1);
    push_n(&mut p2, 1, 1);
    assert_eq!(rows(&next(&mut s1)), Some(1));
    assert_eq!(rows(&next(&mut s2)), Some(1));
    let deadline = Duration::from_secs(1);
    let mut drain = f.manager.begin_drain(deadline);
    f.clock.advance(deadline);
    assert_eq!(f.manager.step_drain(&mut drain, 0), DrainStep::CancelAll);
    // One client reads its error; the other's connection is cut while it still reads what
    // it holds: it never reaches the error.
    assert_eq!(expect_err(&mut s1).condition(), Some("OPERATION_CANCELED"));
    drop(s1);
    drop(s2);
    f.clock.advance(DRAIN_GRACE);
    while f.manager.step_drain(&mut drain, 0) != DrainStep::Done {}
    let report = f.manager.drain_report(&drain);
    assert_eq!(report.canceled.len(), 2, "{report}");
    assert_eq!(report.abandoned.len(), 2, "neither released: {report}");
    assert_eq!(report.untold, vec![c.key(&slow)], "{report}");
    assert!(report.to_string().contains(" untold=1"), "{report}");
}

#[cfg(feature = "spark-connect")]
mod grpc {
    use std::sync::Arc;
    use std::time::Duration;

    use futures::StreamExt;
    use tether::execution::client::{ClientConfig, ExecutionRpc, ReattachingStream};
    use tether::execution::{Code, ExecutionManager, LogConfig, ManagerConfig, StreamLimits};
    use tether::spark::connect::{ConnectClient, ConnectConfig, ConnectService, SERVICE_NAME};
    use tether::wire::connect::execute_plan_response::ResponseType;
    use tether_testing::connect::Caller;
    use tokio::net::TcpListener;
    use tonic::transport::server::TcpIncoming;
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;

    use super::super::connect_grpc::Counting;

    /// `ConnectService` (plans are row counts, connect_grpc's engine) with its health
    /// service on loopback, every stream rotated after 100 responses, at most 1 000 unsent
    /// (so that an interrupt reaches a slow reader soon, rx §3); the service (to drain) and
    /// the address.
    async fn serve() -> (ConnectService<Counting>, String) {
        let manager = ExecutionManager::new(ManagerConfig {
            stream: StreamLimits {
                max_duration: None,
                max_bytes: Some(100 * 20),
            },
            log: LogConfig {
                max_unsent_responses: 1_000,
                ..LogConfig::REATTACHABLE
            },
            ..ManagerConfig::default()
        });
        let connect = ConnectService::new(manager, Counting);
        let health = connect.health().service().await;
        let service = connect.clone().into_service(&ConnectConfig::default());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        // Connections the drain's deadline closes (`ConnectService::connections`).
        let incoming = connect.connections(TcpIncoming::from(listener).with_nodelay(Some(true)));
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(health)
                .add_service(service)
                .serve_with_incoming(incoming),
        );
        (connect, address)
    }

    async fn health_of(address: &str) -> ServingStatus {
        let channel = tonic::transport::Endpoint::from_shared(address.to_owned())
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut health = HealthClient::new(channel);
        let check = |service: &str| HealthCheckRequest {
            service: service.to_owned(),
        };
        let overall = health.check(check("")).await.unwrap().into_inner().status();
        let spark = health.check(check(SERVICE_NAME)).await.unwrap();
        assert_eq!(spark.into_inner().status(), overall, "both names alike");
        overall
    }

    /// The error of the first response of an ExecutePlan of `caller` (a plan of 1 row).
    async fn first_error(
        client: &ConnectClient,
        caller: &Caller,
    ) -> tether::execution::client::RpcError {
        let request = caller.plan(b"1".to_vec());
        match client.execute_plan(request).await {
            Ok(mut stream) => match stream.next().await {
                Some(Err(e)) => e,
                other => panic!("a new execution while draining must fail, got {other:?}"),
            },
            Err(e) => e,
        }
    }

    /// Rows read, the error that ended the stream (if any), the reattaches.
    type Read = (u64, Option<String>, u64);

    /// Reads the execution of `rows` rows, sleeping `pause` every 100 rows; what it read.
    async fn read(address: String, caller: Caller, rows: u64, pause: Duration) -> Read {
        let client = ConnectClient::connect(&address, None).await.unwrap();
        let plan = caller.plan(rows.to_string().into_bytes());
        let mut stream =
            ReattachingStream::new(Arc::new(client), plan, ClientConfig::default()).unwrap();
        let (mut seen, mut error) = (0, None);
        while let Some(item) = stream.next().await {
            match item {
                Ok(r) => {
                    if let Some(ResponseType::ArrowBatch(b)) = r.response_type {
                        assert_eq!(u64::from_be_bytes(b.data[..8].try_into().unwrap()), seen);
                        seen += 1;
                        if seen % 100 == 0 {
                            tokio::time::sleep(pause).await;
                        }
                    }
                }
                Err(e) => {
                    error = Some(e.to_string());
                    break;
                }
            }
        }
        let reattaches = stream.stats().reattaches;
        let _ = stream.close().await;
        (seen, error, reattaches)
    }

    /// `reader` reads `rows` rows (30 ms between rotated streams) and, once its execution
    /// is registered, a drain with a 20 s deadline begins: the read and the drain.
    async fn read_while_draining(
        connect: &ConnectService<Counting>,
        address: &str,
        reader: &Caller,
        rows: u64,
    ) -> (
        tokio::task::JoinHandle<Read>,
        tokio::task::JoinHandle<tether::execution::DrainReport>,
    ) {
        let running = tokio::spawn(read(
            address.to_owned(),
            reader.clone(),
            rows,
            Duration::from_millis(30),
        ));
        while connect.manager().execution_count() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let drain = tokio::spawn({
            let connect = connect.clone();
            async move { connect.drain(Duration::from_secs(20)).await }
        });
        (running, drain)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_drain_serves_running_queries_to_the_end_and_refuses_new_work() {
        let (connect, address) = serve().await;
        assert_eq!(health_of(&address).await, ServingStatus::Serving);
        let reader = Caller::default();
        // 1 000 rows in 10 rotated streams, 30 ms between streams: about 300 ms of reading.
        let (running, drain) = read_while_draining(&connect, &address, &reader, 1_000).await;
        while !connect.manager().is_draining() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // New requests arriving during the drain: health, a new session, a new execution in
        // the live session.
        assert_eq!(health_of(&address).await, ServingStatus::NotServing);
        let client = ConnectClient::connect(&address, None).await.unwrap();
        for (who, caller) in [
            (
                "a new session",
                Caller::new("someone", &uuid::Uuid::new_v4().to_string()),
            ),
            ("a new execution of the live session", reader.clone()),
        ] {
            let e = first_error(&client, &caller).await;
            assert_eq!(e.code(), Code::Unavailable, "{who}: {e}");
            assert_eq!(e.condition(), Some("SERVER_DRAINING"), "{who}: {e}");
            assert!(e.message().contains("The server is draining"), "{who}: {e}");
        }
        // The running query reads every row once, reattaching during the drain.
        let (rows, error, reattaches) = running.await.unwrap();
        assert_eq!((rows, error), (1_000, None));
        assert!(reattaches >= 9, "{reattaches} reattaches");
        let report = drain.await.unwrap();
        assert_eq!(report.live_at_start, 1, "{report}");
        assert!(report.is_clean(), "{report}");
        assert!(report.elapsed < Duration::from_secs(20), "{report}");
        assert_eq!(
            report.sessions_open, 1,
            "the reader's, not the refused one's: {report}"
        );
        assert_eq!(
            connect.manager().stats().created,
            1,
            "nothing new registered"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_drain_deadline_cancels_what_was_not_sent_with_operation_canceled_at_once() {
        let (connect, address) = serve().await;
        // A million rows read slowly: still running at the deadline (its producer waits on
        // the unsent bound, rx §3). 900 rows read slowly: produced at once (below the
        // unsent bound) and still unread at the deadline.
        let slow = |rows| {
            tokio::spawn(read(
                address.clone(),
                Caller::new("reader", &uuid::Uuid::new_v4().to_string()),
                rows,
                Duration::from_millis(100),
            ))
        };
        let (running, unread) = (slow(1_000_000), slow(900));
        while connect.manager().execution_count() < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let report = connect.drain(Duration::from_millis(300)).await;
        assert_eq!(report.live_at_start, 2, "{report}");
        assert_eq!(report.canceled.len(), 2, "{report}");
        for (task, total) in [(running, 1_000_000), (unread, 900)] {
            let (rows, error, _) = task.await.unwrap();
            // 100 rows per 100 ms: the error comes right after the deadline, not after the
            // unsent responses.
            assert!(
                rows > 0 && rows <= 600,
                "{rows} of {total} rows before the cancel"
            );
            let error = error.expect("the client sees the cancel");
            assert!(error.contains("OPERATION_CANCELED"), "{error}");
        }
        // The clients released after their error, within the grace.
        assert!(report.left.is_empty(), "{report}");
        assert!(
            report
                .to_string()
                .starts_with("drained live_at_start=2 canceled=2 abandoned=0 left=0"),
            "{report}"
        );
    }

    /// A client that went away before the deadline: its execution is canceled, nobody
    /// releases it, and the drain abandons it at its end (nobody to tell) rather than leave
    /// it: the report is not `left`, so the example server exits 0.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_drain_abandons_what_no_client_is_attached_to_at_its_end() {
        let (connect, address) = serve().await;
        // A raw reattachable ExecutePlan (no ReattachingStream, which would release on
        // drop): one response read, then the client is gone without a word.
        let client = ConnectClient::connect(&address, None).await.unwrap();
        let request = tether::wire::connect::ExecutePlanRequest {
            request_options: vec![
                tether::wire::connect::execute_plan_request::RequestOption::reattach(true),
            ],
            ..Caller::default().plan(b"1000000".to_vec())
        };
        let mut stream = client.execute_plan(request).await.unwrap();
        stream
            .next()
            .await
            .expect("a response")
            .expect("not an error");
        drop((stream, client));
        let report = connect.drain(Duration::from_millis(200)).await;
        assert_eq!(
            (
                report.canceled.len(),
                report.abandoned.len(),
                report.left.len()
            ),
            (1, 1, 0),
            "{report}"
        );
        assert_eq!(report.canceled, report.abandoned);
        assert_eq!(connect.manager().execution_count(), 0);
        assert_eq!(connect.manager().stats().abandoned, 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_drain_waits_for_a_client_to_release_its_session_after_its_last_query() {
        let (connect, address) = serve().await;
        let reader = Caller::default();
        let (running, drain) = read_while_draining(&connect, &address, &reader, 300).await;
        let (rows, error, _) = running.await.unwrap();
        assert_eq!((rows, error), (300, None));
        // The query is released; the drain must not end before the session's release comes
        // (PySpark's `spark.stop()` a moment after its last query).
        tokio::time::sleep(tether::execution::SESSION_QUIET / 2).await;
        assert!(
            !drain.is_finished(),
            "the drain ended before the session was quiet"
        );
        let client = ConnectClient::connect(&address, None).await.unwrap();
        client
            .release_session(reader.release_session(false))
            .await
            .expect("ReleaseSession while draining");
        let report = drain.await.unwrap();
        assert!(report.is_clean(), "{report}");
        assert_eq!(report.sessions_open, 0, "{report}");
        assert!(report.elapsed < Duration::from_secs(5), "{report}");
    }
}

// ---------------------------------------------------------------------------------------------
// The example server on SIGTERM
// ---------------------------------------------------------------------------------------------

/// The drain's rule alone (`Drain`, no manager): it first asks for the detached check, then
/// waits at most `DRAIN_CHECK`, never past its deadline; at the deadline with executions
/// live it asks to cancel them, then waits out `DRAIN_GRACE`, and ends with the last
/// abandonment and `Done`; the report counts what it was handed.
#[test]
fn the_drain_rule_steps_through_its_phases_on_any_clock() {
    use std::time::{Duration, Instant};
    use tether::execution::{DRAIN_CHECK, DRAIN_GRACE, Drain, DrainStep, DrainView};
    let t0 = Instant::now();
    let live = DrainView {
        live: 1,
        handlers: 0,
        sessions_quiet_for: Some(Duration::ZERO),
    };
    let deadline = Duration::from_millis(120);
    let mut drain = Drain::begin(deadline, t0, 1);
    let check = DrainStep::Abandon {
        detached_for: DRAIN_GRACE,
        delivered_too: false,
    };
    assert_eq!(drain.poll(live, t0), check);
    assert_eq!(drain.poll(live, t0), DrainStep::Wait(t0 + DRAIN_CHECK));
    // Checks every DRAIN_CHECK and waits in between, never past the deadline.
    let t2 = t0 + deadline;
    let mut t = t0 + DRAIN_CHECK;
    loop {
        let mut step = drain.poll(live, t);
        if step == check {
            step = drain.poll(live, t);
        }
        match step {
            DrainStep::Wait(until) => {
                assert_eq!(until, (t + DRAIN_CHECK).min(t2), "never past the deadline");
                t = until;
            }
            DrainStep::CancelAll => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(t, t2, "canceled at the deadline");
    assert!(drain.deadline_passed());
    drain.canceled([]);
    // In grace: checks, then waits; at its end, finishes although one is still live.
    let t3 = t2 + DRAIN_GRACE;
    let mut t = t2;
    loop {
        match drain.poll(live, t) {
            DrainStep::Wait(until) => {
                assert!(until > t && until <= t3, "{until:?}");
                t = until;
            }
            DrainStep::Abandon { delivered_too, .. } if !delivered_too => {}
            DrainStep::Abandon {
                detached_for,
                delivered_too: true,
            } => {
                assert_eq!(
                    detached_for,
                    Duration::ZERO,
                    "the last abandonment takes all"
                );
                assert_eq!(t, t3, "grace waited out");
                break;
            }
            other => panic!("unexpected {other:?} at {:?}", t - t0),
        }
    }
    assert_eq!(drain.poll(live, t3), DrainStep::Done);
    assert_eq!(drain.poll(live, t3), DrainStep::Done, "done stays done");
    let report = drain.report(Vec::new(), 1, t3);
    assert_eq!(report.live_at_start, 1);
    assert_eq!(report.elapsed, deadline + DRAIN_GRACE);
    assert!(report.is_clean(), "nothing handed back: {report}");
}

/// The rule waits for the sessions to be quiet for `SESSION_QUIET` once nothing is live (and
/// for running handlers), then finishes at once; with no deadline it never cancels.
#[test]
fn the_drain_rule_waits_for_quiet_sessions_and_handlers() {
    use std::time::{Duration, Instant};
    use tether::execution::{Drain, DrainStep, DrainView, SESSION_QUIET};
    let t0 = Instant::now();
    let mut drain = Drain::begin(Duration::MAX, t0, 0);
    let quiet_for = Duration::from_millis(900);
    let view = DrainView {
        live: 0,
        handlers: 0,
        sessions_quiet_for: Some(quiet_for),
    };
    assert!(matches!(drain.poll(view, t0), DrainStep::Abandon { .. }));
    let DrainStep::Wait(until) = drain.poll(view, t0) else {
        panic!("waits for quiet sessions")
    };
    assert!(
        until <= t0 + (SESSION_QUIET - quiet_for),
        "{:?}",
        until - t0
    );
    let busy = DrainView {
        handlers: 1,
        sessions_quiet_for: Some(SESSION_QUIET),
        ..view
    };
    let t1 = t0 + Duration::from_secs(3600);
    assert!(matches!(drain.poll(busy, t1), DrainStep::Abandon { .. }));
    assert!(
        matches!(drain.poll(busy, t1), DrainStep::Wait(_)),
        "a running handler holds a drain without a deadline"
    );
    let settled = DrainView {
        handlers: 0,
        ..busy
    };
    assert_eq!(
        drain.poll(settled, t1),
        DrainStep::Abandon {
            detached_for: Duration::ZERO,
            delivered_too: true
        }
    );
    assert_eq!(drain.poll(settled, t1), DrainStep::Done);
    assert!(!drain.deadline_passed());
}

/// The manager runs the rule on its own clock (`begin_drain`, `step_drain`): an execution no
/// client is attached to is abandoned once detached for `DRAIN_GRACE`, one still streaming
/// is canceled at the deadline (its client reads `OPERATION_CANCELED`), and the report says
/// which was which.
#[test]
fn the_manager_steps_a_drain_on_its_manual_clock() {
    use std::time::Duration;
    use tether::execution::{DRAIN_GRACE, DrainStep};
    let f = ManualManager::default();
    let c = Caller::default();
    let (attached, detached) = (op_id(), op_id());
    let (mut p1, mut s1) = start(&f.manager, &c.execute(&attached));
    let (_p2, s2) = start(&f.manager, &c.execute(&detached));
    drop(s2);
    push_n(&mut p1, 1, 1);
    assert_eq!(rows(&next(&mut s1)), Some(1));
    let deadline = Duration::from_secs(30);
    let mut drain = f.manager.begin_drain(deadline);
    assert!(f.manager.is_draining());
    let step = |drain: &mut tether::execution::Drain| f.manager.step_drain(drain, 0);
    let DrainStep::Wait(_) = step(&mut drain) else {
        panic!("both still live")
    };
    assert_eq!(f.manager.execution_count(), 2);
    f.clock.advance(DRAIN_GRACE);
    let DrainStep::Wait(_) = step(&mut drain) else {
        panic!("the attached one is still live")
    };
    assert_eq!(
        f.manager.execution_keys(),
        vec![c.key(&attached)],
        "the detached one abandoned after DRAIN_GRACE"
    );
    f.clock.advance(deadline);
    assert_eq!(step(&mut drain), DrainStep::CancelAll);
    assert_eq!(
        expect_err(&mut s1).condition(),
        Some("OPERATION_CANCELED"),
        "the attached client is told at once"
    );
    drop(s1);
    f.manager
        .release_execute(&c.release_all(&attached))
        .unwrap();
    f.clock.advance(DRAIN_GRACE);
    let mut steps = 0;
    while step(&mut drain) != DrainStep::Done {
        steps += 1;
        assert!(steps < 4, "done once released and quiet");
    }
    let report = f.manager.drain_report(&drain);
    assert_eq!(report.live_at_start, 2);
    assert_eq!(report.canceled, vec![c.key(&attached)]);
    assert_eq!(report.abandoned, vec![c.key(&detached)]);
    assert!(report.left.is_empty(), "{report}");
    assert!(!report.is_clean());
}

#[cfg(feature = "spark-connect")]
mod example {
    use std::sync::Arc;
    use std::time::Duration;

    use futures::StreamExt;
    use tether::execution::Code;
    use tether::execution::client::{ClientConfig, ExecutionRpc, ReattachingStream};
    use tether::spark::connect::ConnectClient;
    use tether::wire::connect::execute_plan_response::ResponseType;
    use tether::wire::connect::{ExecutePlanRequest, Plan, Relation, UserContext};

    use super::super::pyspark_connect::{Server, stat};

    fn range(session_id: &str, end: i64) -> ExecutePlanRequest {
        ExecutePlanRequest {
            session_id: session_id.to_owned(),
            user_context: Some(UserContext::new("tether-drain")),
            plan: Some(Plan::root(prost::Message::encode_to_vec(&Relation::range(
                0, end, 1,
            )))),
            ..Default::default()
        }
    }

    /// `examples/connect_server` (what a user copies) serves `spark.range` to tether's client,
    /// answers health on the same port, and on SIGTERM drains (nothing live: a clean report)
    /// and exits 0.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_user_example_serves_drains_and_exits_0() {
        let binary = super::super::pyspark_connect::example_binary("connect_server");
        let mut server = tokio::task::spawn_blocking(move || Server::start_binary(&binary, &[]))
            .await
            .unwrap();
        let client = ConnectClient::connect(&server.url(), None).await.unwrap();
        let session = uuid::Uuid::new_v4().to_string();
        let mut stream = ReattachingStream::new(
            Arc::new(client),
            range(&session, 100_000),
            ClientConfig::default(),
        )
        .unwrap();
        let mut rows = 0;
        while let Some(item) = stream.next().await {
            if let Some(ResponseType::ArrowBatch(batch)) = item.unwrap().response_type {
                rows += batch.row_count;
            }
        }
        assert_eq!(rows, 100_000);
        stream.close().await;
        server.terminate();
        let (status, server) = tokio::task::spawn_blocking(move || {
            (server.wait_exit(Duration::from_secs(20)), server)
        })
        .await
        .unwrap();
        let report = server.drain_report();
        assert!(
            report.starts_with("drained live_at_start=0 canceled=0 abandoned=0 left=0 "),
            "{report}"
        );
        assert!(status.success(), "exit status {status}; {report}");
    }

    /// SIGTERM while a client holds a request whose message never comes (HTTP/2 headers and
    /// a gRPC frame header promising 100 bytes, then nothing): no handler ever ran, so once
    /// the graceful stop has waited its 5 s the server closes that connection and exits 0
    /// instead of reporting streams it cut short.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_that_never_reached_a_handler_does_not_fail_the_stop() {
        let mut server = tokio::task::spawn_blocking(|| Server::start(&[]))
            .await
            .unwrap();
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", server.port))
            .await
            .unwrap();
        let (client, connection) = h2::client::handshake(tcp).await.unwrap();
        let connection = tokio::spawn(connection);
        let mut client = client.ready().await.unwrap();
        let request = tonic::codegen::http::Request::builder()
            .method("POST")
            .uri(format!(
                "http://127.0.0.1:{}/spark.connect.SparkConnectService/Config",
                server.port
            ))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
        let (response, mut body) = client.send_request(request, false).unwrap();
        body.send_data(bytes::Bytes::from_static(&[0, 0, 0, 0, 100]), false)
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        server.terminate();
        let (status, server) = tokio::task::spawn_blocking(move || {
            (server.wait_exit(Duration::from_secs(20)), server)
        })
        .await
        .unwrap();
        let lines = server.stdout_lines();
        assert!(status.success(), "exit status {status}; stdout {lines:?}");
        assert_eq!(
            server.log_lines_with(&["reached no handler", "closed their connections"]),
            1,
            "{lines:?}"
        );
        // The stalled request itself ended with the connection, not with an answer.
        assert!(
            response.await.is_err(),
            "no response to a request never completed"
        );
        drop(body);
        connection.abort();
    }

    /// SIGTERM while a client reads `range(1000000)` slowly (every stream rotated after one
    /// response of 10 000 rows): the client reads every row once across reattaches made
    /// during the drain, a new session is refused with `SERVER_DRAINING`, and the server
    /// reports a clean drain and exits 0.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_example_server_drains_on_sigterm_and_exits_0() {
        let mut server =
            tokio::task::spawn_blocking(|| Server::rotating(&["--drain-timeout-ms", "60000"]))
                .await
                .unwrap();
        let client = ConnectClient::connect(&server.url(), None).await.unwrap();
        let session = uuid::Uuid::new_v4().to_string();
        let mut stream = ReattachingStream::new(
            Arc::new(client.clone()),
            range(&session, 1_000_000),
            ClientConfig::default(),
        )
        .unwrap();
        let (mut rows, mut terminated) = (0i64, false);
        while let Some(item) = stream.next().await {
            let response = item.unwrap_or_else(|e| panic!("after {rows} rows: {e}"));
            let Some(ResponseType::ArrowBatch(batch)) = response.response_type else {
                continue;
            };
            rows += batch.row_count;
            if !terminated {
                server.terminate();
                terminated = true;
                while !server
                    .stdout_lines()
                    .iter()
                    .any(|l| l.starts_with("draining"))
                {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                // A new session during the drain. The example prints `draining` when the
                // signal arrives, a moment before the server's drain refuses new work: a
                // new session may still be served until then.
                let refused_by = tokio::time::Instant::now() + Duration::from_secs(10);
                let e = loop {
                    let other = uuid::Uuid::new_v4().to_string();
                    let refusal = match client.execute_plan(range(&other, 10)).await {
                        Ok(mut s) => s.next().await.expect("an item").err(),
                        Err(e) => Some(e),
                    };
                    if let Some(e) = refusal {
                        break e;
                    }
                    assert!(
                        tokio::time::Instant::now() < refused_by,
                        "new sessions still served 10 s after `draining`"
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                };
                assert_eq!(e.code(), Code::Unavailable, "{e}");
                assert_eq!(e.condition(), Some("SERVER_DRAINING"), "{e}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(rows, 1_000_000, "every row once");
        let reattaches = stream.stats().reattaches;
        assert!(reattaches >= 99, "{reattaches} reattaches");
        let releases = stream.close().await;
        assert_eq!(releases.failed, 0, "{releases:?}");
        let status = tokio::task::spawn_blocking(move || {
            (server.wait_exit(Duration::from_secs(30)), server)
        })
        .await
        .unwrap();
        let (status, server) = status;
        assert!(status.success(), "exit status {status}");
        let lines = server.stdout_lines();
        let report = server.drain_report();
        assert!(
            report.starts_with(
                "drained live_at_start=1 canceled=0 abandoned=0 left=0 sessions_open=1 "
            ),
            "{report}"
        );
        let last = lines.last().expect("a last line");
        let stats = super::super::pyspark_connect::parse_stats(last)
            .unwrap_or_else(|| panic!("the last line is no stats line: {last:?}"));
        assert_eq!((stat(&stats, "created"), stat(&stats, "released")), (1, 1));
        println!("{report}; {reattaches} reattaches during the drain; {last}");
    }
}
