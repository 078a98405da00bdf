//! Server-side scenarios of the reattach rx §7, ported to
//! tether's [`ExecutionManager`]. Each `rx_sNN_*` test is scenario NN of rx §7; `rx_x_*` tests
//! cover the rules of issue 4 that have no upstream scenario number. Time is a
//! [`ManualClock`]; nothing sleeps for real.

use std::time::Duration;

use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use tether::execution::{
    ConnectError, ConsumerEvent, ExecutionPhase, ForwardError, LogConfig, ManagerConfig,
    ProduceError, ResponseStream, StreamEnd, StreamLimits, Submitted,
};
use tether::wire::connect::{ExecutePlanResponse, InterruptType, Plan, interrupt_request};
use tether_testing::connect::*;
use uuid::Uuid;

// ---------------------------------------------------------------------------------------------
// rx §7.1 ReattachableExecuteSuite
// ---------------------------------------------------------------------------------------------

#[test]
fn rx_s01_deadline_rotation_then_reattach_continues() {
    let f = ManualManager::default();
    let o = op_id();
    let (mut p, mut s) = start(&f.manager, &execute(&o));
    push_n(&mut p, 1, 3);
    let r1 = next(&mut s);
    f.clock.advance(Duration::from_secs(121));
    assert_eq!(s.try_next(), ConsumerEvent::End(StreamEnd::Rotated));
    assert_eq!(s.end(), Some(Ok(StreamEnd::Rotated)));
    let mut s2 = f
        .manager
        .reattach_execute(&reattach(&o, Some(&r1.response_id)))
        .unwrap();
    assert_ne!(s2.consumer_id(), s.consumer_id());
    p.finish().unwrap();
    let (got, end) = drain(&mut s2);
    assert_eq!(got.iter().filter_map(rows).collect::<Vec<_>>(), vec![2, 3]);
    assert!(got.last().unwrap().is_result_complete());
    assert_eq!(end, ConsumerEvent::End(StreamEnd::Complete));
}

#[test]
fn rx_s02_interrupt_all_senders_disconnects() {
    let f = ManualManager::default();
    let o = op_id();
    let (mut p, mut s) = start(&f.manager, &execute(&o));
    push_n(&mut p, 1, 2);
    next(&mut s);
    assert_eq!(f.manager.disconnect_all_streams(), 1);
    assert_eq!(expect_err(&mut s), ConnectError::Disconnected);
    assert_eq!(
        s.try_next(),
        ConsumerEvent::Error(ConnectError::Disconnected)
    );
    assert_eq!(f.manager.execution_count(), 1);
}

#[test]
fn rx_s03_reattach_preempts_previous_stream() {
    let f = ManualManager::default();
    let o = op_id();
    let (mut p, mut s1) = start(&f.manager, &execute(&o));
    push_n(&mut p, 1, 3);
    next(&mut s1);
    let mut s2 = f.manager.reattach_execute(&reattach(&o, None)).unwrap();
    assert_eq!(rows(&next(&mut s2)), Some(1));
    assert_eq!(expect_err(&mut s1), ConnectError::Disconnected);
    let mut s3 = f.manager.reattach_execute(&reattach(&o, None)).unwrap();
    assert_eq!(expect_err(&mut s2), ConnectError::Disconnected);
    assert_eq!(rows(&next(&mut s3)), Some(1));
}

#[test]
fn rx_s04_disconnected_stream_resumes_by_reattach() {
    let f = ManualManager::default();
    let o = op_id();
    let (mut p, mut s) = start(&f.manager, &execute(&o));
    push_n(&mut p, 1, 3);
    let r1 = next(&mut s);
    f.manager.disconnect_all_streams();
    assert_eq!(expect_err(&mut s), ConnectError::Disconnected);
    let mut s2 = f
        .manager
        .reattach_execute(&reattach(&o, Some(&r1.response_id)))
        .unwrap();
    assert_eq!(rows(&next(&mut s2)), Some(2));
    assert_eq!(rows(&next(&mut s2)), Some(3));
}

#[test]
fn rx_s05_raw_reattach_preempts_client_which_reattaches_again() {
    let f = ManualManager::default();
    let o = op_id();
    let (mut p, mut client) = start(&f.manager, &execute(&o));
    push_n(&mut p, 1, 4);
    let r1 = next(&mut client);
    let mut raw = f
        .manager
        .reattach_execute(&reattach(&o, Some(&r1.response_id)))
        .unwrap();
    assert_eq!(rows(&next(&mut raw)), Some(2));
    assert_eq!(expect_err(&mut client), ConnectError::Disconnected);
    let mut client2 = f
        .manager
        .reattach_execute(&reattach(&o, Some(&r1.response_id)))
        .unwrap();
    assert_eq!(expect_err(&mut raw), ConnectError::Disconnected);
    assert_eq!(
        drain(&mut client2)
            .0
            .iter()
            .filter_map(rows)
            .collect::<Vec<_>>(),
        vec![2, 3, 4]
    );
}

#[test]
fn rx_s06_detached_execution_is_abandoned() {
    let f = ManualManager::default();
    let o = op_id();
    let (mut p, mut s) = start(&f.manager, &execute(&o));
    push_n(&mut p, 1, 2);
    next(&mut s);
    f.clock.advance(Duration::from_secs(121));
    assert_eq!(s.try_next(), ConsumerEvent::End(StreamEnd::Rotated));
    f.clock.advance(Duration::from_secs(299));
    assert_eq!(f.manager.maintain().abandoned, 0);
    f.clock.advance(Duration::from_secs(1));
    assert_eq!(f.manager.maintain().abandoned, 1);
    assert_eq!(f.manager.execution_count(), 0);
    assert!(f.manager.is_abandoned(&key(&o)));
    let e = f.manager.reattach_execute(&reattach(&o, None)).unwrap_err();
    assert_eq!(condition(&e), "INVALID_HANDLE.OPERATION_ABANDONED");
    for reattachable in [false, true] {
        let e = f
            .manager
            .execute_plan(&Caller::default().execute_with(&o, reattachable))
            .unwrap_err();
        assert_eq!(condition(&e), "INVALID_HANDLE.OPERATION_ABANDONED");
    }
    assert_eq!(p.try_push(batch(9)), Err(ProduceError::Closed));
}

#[test]
fn rx_s07_release_until_then_positions() {
    let f = ManualManager::default();
    let o = op_id();
    let (mut p, mut client) = start(&f.manager, &execute(&o));
    push_n(&mut p, 1, 5);
    let r1 = next(&mut client);
    f.manager
        .release_execute(&release_until(&o, &r1.response_id))
        .unwrap();
    let r2 = next(&mut client);
    f.manager
        .release_execute(&release_until(&o, &r2.response_id))
        .unwrap();
    let e = f
        .manager
        .reattach_execute(&reattach(&o, Some(&r1.response_id)))
        .unwrap_err();
    assert_eq!(
        e,
        ConnectError::PositionNotAvailable {
            response_id: r2.response_id.clone(),
            index: 2
        }
    );
    // that failed reattach still preempted the client, as Spark's sender does
    assert_eq!(expect_err(&mut client), ConnectError::Disconnected);
    let mut raw = f
        .manager
        .reattach_execute(&reattach(&o, Some(&r2.response_id)))
        .unwrap();
    let raw_ids: Vec<String> = drain(&mut raw)
        .0
        .into_iter()
        .map(|r| r.response_id)
        .collect();
    assert_eq!(raw_ids.len(), 3);
    let mut client2 = f
        .manager
        .reattach_execute(&reattach(&o, Some(&r2.response_id)))
        .unwrap();
    let ids: Vec<String> = drain(&mut client2)
        .0
        .into_iter()
        .map(|r| r.response_id)
        .collect();
    assert_eq!(ids, raw_ids);
}

#[test]
fn rx_s08_auto_release_beyond_retry_budget() {
    let budget = 1000;
    let f = ManualManager::new(ManagerConfig {
        log: LogConfig {
            retry_budget: budget,
            ..LogConfig::REATTACHABLE
        },
        ..ManagerConfig::default()
    });
    let o = op_id();
    let (mut p, mut s) = start(&f.manager, &execute(&o));
    push_n(&mut p, 1, 100);
    let mut consumed = 0u64;
    let mut last = String::new();
    // Spark's test consumes 1.1 × the budget; with equal sizes the first eviction needs the
    // kept responses minus the oldest to reach the budget, so read a little further.
    while consumed < budget * 3 / 2 {
        let r = next(&mut s);
        consumed += prost::Message::encoded_len(&r) as u64;
        last = r.response_id;
    }
    let e = f.manager.reattach_execute(&reattach(&o, None)).unwrap_err();
    assert!(
        matches!(e, ConnectError::PositionNotAvailable { index: 1, .. }),
        "{e}"
    );
    assert_eq!(expect_err(&mut s), ConnectError::Disconnected);
    let Some(tether::execution::Lookup::Reattachable(any)) = f.manager.lookup(&key(&o)) else {
        panic!("execution vanished")
    };
    let tether::execution::AnyExecution::Streaming(h) = any else {
        panic!("not streaming")
    };
    // the retry buffer: below the budget once the oldest and the newest kept response are
    // left out (rx §3.4)
    let size = 200;
    assert!(
        h.retained_bytes() < budget + 2 * size,
        "{}",
        h.retained_bytes()
    );
    let mut s2 = f
        .manager
        .reattach_execute(&reattach(&o, Some(&last)))
        .unwrap();
    p.finish().unwrap();
    let (rest, end) = drain(&mut s2);
    assert!(rest.last().unwrap().is_result_complete());
    assert_eq!(end, ConsumerEvent::End(StreamEnd::Complete));
}

#[test]
fn rx_s09_interrupt_operation_id_cancels_stream() {
    let f = ManualManager::default();
    let o = op_id();
    let (mut p, mut s) = start(&f.manager, &execute(&o));
    push_n(&mut p, 1, 1);
    let r = f.manager.interrupt(&interrupt_op(&o)).unwrap();
    assert_eq!(r.interrupted_ids, vec![o.clone()]);
    assert_eq!(rows(&next(&mut s)), Some(1));
    assert_eq!(expect_err(&mut s), ConnectError::OperationCanceled);
    assert!(p.is_cancelled());
    assert_eq!(p.try_push(batch(2)), Err(ProduceError::Cancelled));
}

#[tokio::test(start_paused = true)]
async fn rx_s10_big_result_completes_and_cleans_up() {
    let f = ManualManager::default();
    let o = op_id();
    let (mut p, mut s) = start(&f.manager, &execute(&o));
    let producer = tokio::spawn(async move {
        for i in 0..20_000 {
            p.push(batch(i)).await.unwrap();
        }
        p.finish().unwrap();
    });
    let mut n = 0;
    let mut complete = false;
    while let Some(r) = s.next().await {
        let r = r.unwrap();
        if r.is_result_complete() {
            complete = true;
        } else {
            assert_eq!(rows(&r), Some(n));
            n += 1;
        }
    }
    producer.await.unwrap();
    assert!(complete);
    assert_eq!(n, 20_000);
    f.manager.release_execute(&release_all(&o)).unwrap();
    assert_eq!(f.manager.execution_count(), 0);
}

#[tokio::test(start_paused = true)]
async fn rx_s11_slow_consumer_is_backpressured() {
    let f = ManualManager::new(ManagerConfig {
        log: LogConfig {
            max_unsent_responses: 4,
            max_unsent_bytes: 1 << 20,
            ..LogConfig::REATTACHABLE
        },
        ..ManagerConfig::default()
    });
    let o = op_id();
    let (mut p, mut s) = start(&f.manager, &execute(&o));
    let producer = tokio::spawn(async move {
        for i in 0..50 {
            p.push(batch(i)).await.unwrap();
        }
        p.finish().unwrap();
    });
    let mut n = 0;
    let mut size = 0;
    while let Some(r) = s.next().await {
        let r = r.unwrap();
        size = size.max(prost::Message::encoded_len(&r) as u64);
        if !r.is_result_complete() {
            n += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let Some(tether::execution::Lookup::Reattachable(any)) = f.manager.lookup(&key(&o)) else {
            panic!()
        };
        let unsent = match any {
            tether::execution::AnyExecution::Streaming(h) => h.unsent_bytes(),
            tether::execution::AnyExecution::Finishing(h) => h.unsent_bytes(),
            other => panic!("{}", other.state_name()),
        };
        // four batches, plus the ResultComplete that finishing appends past the bound
        assert!(unsent <= 5 * (size + 2), "unsent {unsent} > 5 × {size}");
    }
    producer.await.unwrap();
    assert_eq!(n, 50);
}

fn rotating(max_bytes: u64) -> ManagerConfig {
    ManagerConfig {
        stream: StreamLimits {
            max_duration: Some(Duration::from_secs(1)),
            max_bytes: Some(max_bytes),
        },
        ..ManagerConfig::default()
    }
}

/// A client loop at this layer: read, reattach after every graceful end without
/// ResultComplete, release until each response. Returns rows and reattach count.
fn consume_with_reattach(
    f: &ManualManager,
    o: &str,
    mut s: ResponseStream,
    mut tick: impl FnMut(),
) -> (Vec<i64>, usize) {
    let mut got = Vec::new();
    let mut last: Option<String> = None;
    let mut reattaches = 0;
    loop {
        match s.try_next() {
            ConsumerEvent::Response(r) => {
                f.manager
                    .release_execute(&release_until(o, &r.response_id))
                    .unwrap();
                last = Some(r.response_id.clone());
                if r.is_result_complete() {
                    f.manager.release_execute(&release_all(o)).unwrap();
                    return (got, reattaches);
                }
                got.extend(rows(&r));
            }
            ConsumerEvent::Pending { .. } => tick(),
            ConsumerEvent::End(StreamEnd::Rotated) => {
                reattaches += 1;
                s = f
                    .manager
                    .reattach_execute(&reattach(o, last.as_deref()))
                    .unwrap();
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn rx_s12_byte_rotation_many_reattaches() {
    let f = ManualManager::new(rotating(300));
    let o = op_id();
    let (mut p, s) = start(&f.manager, &execute(&o));
    push_n(&mut p, 0, 200);
    p.finish().unwrap();
    let (got, reattaches) = consume_with_reattach(&f, &o, s, || panic!("nothing pending"));
    assert_eq!(got, (0..200).collect::<Vec<_>>());
    assert!(reattaches >= 40, "{reattaches}");
    assert_eq!(f.manager.execution_count(), 0);
}

#[test]
fn rx_s13_byte_rotation_with_slow_producer() {
    let f = ManualManager::new(rotating(300));
    let o = op_id();
    let (p, s) = start(&f.manager, &execute(&o));
    let mut producer = Some(p);
    let mut produced = 0;
    let clock = f.clock.clone();
    let (got, reattaches) = consume_with_reattach(&f, &o, s, || {
        if produced < 100 {
            if let Some(p) = producer.as_mut() {
                p.try_push(batch(produced)).unwrap();
            }
            produced += 1;
        } else if let Some(p) = producer.take() {
            p.finish().unwrap();
        }
        clock.advance(Duration::from_millis(30));
    });
    assert_eq!(got, (0..100).collect::<Vec<_>>());
    assert!(reattaches > 5);
    assert_eq!(f.manager.execution_count(), 0);
}

#[test]
fn rx_s14_time_rotation_gives_empty_streams() {
    let f = ManualManager::new(rotating(1 << 30));
    let o = op_id();
    let (p, mut s) = start(&f.manager, &execute(&o));
    let mut empty_rotations = 0;
    for _ in 0..10 {
        assert!(matches!(
            s.try_next(),
            ConsumerEvent::Pending { wake_at: Some(_) }
        ));
        f.clock.advance(Duration::from_secs(1));
        assert_eq!(s.try_next(), ConsumerEvent::End(StreamEnd::Rotated));
        empty_rotations += 1;
        s = f.manager.reattach_execute(&reattach(&o, None)).unwrap();
    }
    p.finish().unwrap();
    let (got, end) = drain(&mut s);
    assert_eq!(got.len(), 1);
    assert!(got[0].is_result_complete());
    assert_eq!(end, ConsumerEvent::End(StreamEnd::Complete));
    assert_eq!(empty_rotations, 10);
}

#[test]
fn rx_s15_reattach_and_release_refresh_session_access() {
    let f = ManualManager::default();
    let o = op_id();
    let (mut p, mut s) = start(&f.manager, &execute(&o));
    push_n(&mut p, 1, 2);
    let r1 = next(&mut s);
    let before = f
        .manager
        .session_last_access(&Caller::default().session_key())
        .unwrap();
    f.clock.advance(Duration::from_secs(10));
    let mut s2 = f
        .manager
        .reattach_execute(&reattach(&o, Some(&r1.response_id)))
        .unwrap();
    next(&mut s2);
    let after_reattach = f
        .manager
        .session_last_access(&Caller::default().session_key())
        .unwrap();
    assert!(after_reattach > before);
    f.clock.advance(Duration::from_secs(10));
    f.manager
        .release_execute(&release_until(&o, &r1.response_id))
        .unwrap();
    assert!(
        f.manager
            .session_last_access(&Caller::default().session_key())
            .unwrap()
            > after_reattach
    );
}

#[test]
fn rx_s16_released_execution_is_not_tombstoned() {
    let f = ManualManager::default();
    let o = op_id();
    let (p, _s) = start(&f.manager, &execute(&o));
    p.finish().unwrap();
    let r = f.manager.release_execute(&release_all(&o)).unwrap();
    assert_eq!(r.operation_id.as_deref(), Some(o.as_str()));
    assert!(!f.manager.is_abandoned(&key(&o)));
    assert!(f.manager.abandoned_keys().is_empty());
    let e = f.manager.reattach_execute(&reattach(&o, None)).unwrap_err();
    assert_eq!(condition(&e), "INVALID_HANDLE.OPERATION_NOT_FOUND");
}

#[test]
fn rx_s17_reattach_before_start_is_not_reattachable() {
    let f = ManualManager::default();
    let o = op_id();
    let Submitted::Reattachable(init) = f.manager.execute_plan(&execute(&o)).unwrap() else {
        panic!("expected a reattachable submission")
    };
    let e = f.manager.reattach_execute(&reattach(&o, None)).unwrap_err();
    assert_eq!(e, ConnectError::NotReattachable);
    let (_h, mut p, mut s) = init.start();
    p.try_push(batch(1)).unwrap();
    assert_eq!(rows(&next(&mut s)), Some(1));
}

#[test]
fn rx_s18_removed_execution_ends_stream_and_producer() {
    let f = ManualManager::default();
    let o = op_id();
    let (mut p, mut s) = start(&f.manager, &execute(&o));
    push_n(&mut p, 1, 1);
    f.manager.release_execute(&release_all(&o)).unwrap();
    assert_eq!(f.manager.execution_count(), 0);
    assert_eq!(expect_err(&mut s), ConnectError::Disconnected);
    assert!(p.is_cancelled());
    assert!(p.cancelled().now_or_never().is_some());
    assert_eq!(p.try_push(batch(2)), Err(ProduceError::Closed));
}

// ---------------------------------------------------------------------------------------------
// rx §7.2 SparkConnectServiceE2ESuite
// ---------------------------------------------------------------------------------------------

#[test]
fn rx_s19_execute_plan_registers_before_any_response() {
    let f = ManualManager::default();
    let o = op_id();
    let submitted = f.manager.execute_plan(&execute(&o)).unwrap();
    assert_eq!(submitted.operation_id(), o);
    assert_eq!(f.manager.execution_count(), 1);
    assert_eq!(f.manager.phase(&key(&o)), Some(ExecutionPhase::Init));
    let (_p, _s) = submitted.start();
    assert_eq!(f.manager.phase(&key(&o)), Some(ExecutionPhase::Streaming));
}

#[test]
fn rx_s20_release_session_stops_running_queries() {
    let f = ManualManager::default();
    let (o1, o2) = (op_id(), op_id());
    let (mut p1, mut s1) = start(&f.manager, &execute(&o1));
    let (mut p2, mut s2) = start(&f.manager, &execute(&o2));
    push_n(&mut p1, 1, 1);
    push_n(&mut p2, 1, 1);
    let rs = f
        .manager
        .release_session(&Caller::default().release_session(false));
    assert!(!rs.server_side_session_id.is_empty());
    let again = f
        .manager
        .release_session(&Caller::default().release_session(false));
    assert!(again.server_side_session_id.is_empty());
    assert_eq!(f.manager.execution_count(), 0);
    for (s, o) in [(&mut s1, &o1), (&mut s2, &o2)] {
        assert_eq!(expect_err(s), ConnectError::Disconnected);
        let e = f.manager.reattach_execute(&reattach(o, None)).unwrap_err();
        assert_eq!(condition(&e), "INVALID_HANDLE.SESSION_CLOSED");
    }
    let e = f
        .manager
        .interrupt(&Caller::default().interrupt(InterruptType::All, None))
        .unwrap_err();
    assert_eq!(condition(&e), "INVALID_HANDLE.SESSION_CLOSED");
    assert!(p1.is_cancelled() && p2.is_cancelled());
}

#[tokio::test(start_paused = true)]
async fn rx_s21_release_session_wakes_blocked_producer() {
    let f = ManualManager::new(ManagerConfig {
        log: LogConfig {
            max_unsent_responses: 1,
            ..LogConfig::REATTACHABLE
        },
        ..ManagerConfig::default()
    });
    let o = op_id();
    let (mut p, _s) = start(&f.manager, &execute(&o));
    let task = tokio::spawn(async move {
        p.push(batch(1)).await.unwrap();
        p.push(batch(2)).await
    });
    tokio::task::yield_now().await;
    f.manager
        .release_session(&Caller::default().release_session(false));
    assert_eq!(task.await.unwrap(), Err(ProduceError::Closed));
    assert_eq!(f.manager.execution_count(), 0);
}

#[test]
fn rx_s22_sessions_isolated_by_user() {
    let f = ManualManager::default();
    let (o1, o2) = (op_id(), op_id());
    let (_p1, mut s1) = start(
        &f.manager,
        &Caller::new("u1", SESSION_ID).execute_with(&o1, true),
    );
    let (mut p2, mut s2) = start(
        &f.manager,
        &Caller::new("u2", SESSION_ID).execute_with(&o2, true),
    );
    f.manager
        .release_session(&Caller::new("u1", SESSION_ID).release_session(false));
    assert_eq!(expect_err(&mut s1), ConnectError::Disconnected);
    p2.try_push(batch(1)).unwrap();
    assert_eq!(rows(&next(&mut s2)), Some(1));
    let (_p3, _s3) = start(
        &f.manager,
        &Caller::new("u2", SESSION_ID).execute_with(&op_id(), true),
    );
    let e = f
        .manager
        .execute_plan(&Caller::new("u1", SESSION_ID).execute_with(&op_id(), true))
        .unwrap_err();
    assert_eq!(condition(&e), "INVALID_HANDLE.SESSION_CLOSED");
    // u1 never sees u2's operation
    let e = f
        .manager
        .reattach_execute(&Caller::new("u1", SESSION_ID).reattach(&o2, None))
        .unwrap_err();
    assert_eq!(condition(&e), "INVALID_HANDLE.SESSION_CLOSED");
    assert_eq!(f.manager.execution_count(), 2);
}

#[test]
fn rx_s23_sessions_isolated_by_session_id() {
    let f = ManualManager::default();
    let (o1, o2) = (op_id(), op_id());
    let (_p1, mut s1) = start(&f.manager, &Caller::default().execute_with(&o1, true));
    let (mut p2, mut s2) = start(
        &f.manager,
        &Caller::new(USER, OTHER_SESSION_ID).execute_with(&o2, true),
    );
    f.manager
        .release_session(&Caller::default().release_session(false));
    assert_eq!(expect_err(&mut s1), ConnectError::Disconnected);
    p2.try_push(batch(7)).unwrap();
    assert_eq!(rows(&next(&mut s2)), Some(7));
    let e = f
        .manager
        .reattach_execute(&Caller::new(USER, OTHER_SESSION_ID).reattach(&o1, None))
        .unwrap_err();
    assert_eq!(condition(&e), "INVALID_HANDLE.OPERATION_NOT_FOUND");
}

#[test]
fn rx_s24_closed_session_cannot_be_reused() {
    let f = ManualManager::default();
    let _ = start(&f.manager, &execute(&op_id()));
    f.manager
        .release_session(&Caller::default().release_session(false));
    assert!(
        f.manager
            .is_session_closed(&Caller::default().session_key())
    );
    let e = f.manager.execute_plan(&execute(&op_id())).unwrap_err();
    assert_eq!(
        e,
        ConnectError::SessionClosed {
            handle: SESSION_ID.into()
        }
    );
}

#[test]
fn rx_s25_other_session_or_user_works_after_close() {
    let f = ManualManager::default();
    let _ = start(&f.manager, &execute(&op_id()));
    f.manager
        .release_session(&Caller::default().release_session(false));
    assert!(
        f.manager
            .execute_plan(&Caller::new(USER, OTHER_SESSION_ID).execute_with(&op_id(), true))
            .is_ok()
    );
    assert!(
        f.manager
            .execute_plan(&Caller::new("bob", SESSION_ID).execute_with(&op_id(), true))
            .is_ok()
    );
}

#[test]
fn rx_s26_execution_finishes_before_results_are_consumed() {
    let f = ManualManager::default();
    let o = op_id();
    let (mut p, _s) = start(&f.manager, &execute(&o));
    push_n(&mut p, 0, 1000);
    p.finish().unwrap();
    assert_eq!(f.manager.phase(&key(&o)), Some(ExecutionPhase::Finishing));
}

#[test]
fn rx_s28_hijacked_server_side_session_id_is_session_changed() {
    let f = ManualManager::default();
    let _ = start(&f.manager, &execute(&op_id()));
    let _ = start(&f.manager, &execute(&op_id()));
    let real = f
        .manager
        .server_side_session_id(&Caller::default().session_key())
        .unwrap();
    let mut r = execute(&op_id());
    r.client_observed_server_side_session_id = Some(real.clone());
    assert!(f.manager.execute_plan(&r).is_ok());
    let fake = Uuid::new_v4().to_string();
    r.operation_id = Some(op_id());
    r.client_observed_server_side_session_id = Some(fake.clone());
    let e = f.manager.execute_plan(&r).unwrap_err();
    assert_eq!(
        e,
        ConnectError::SessionChanged {
            handle: SESSION_ID.into()
        }
    );
    let mut ra = reattach(&op_id(), None);
    ra.client_observed_server_side_session_id = Some(fake.clone());
    assert_eq!(
        condition(&f.manager.reattach_execute(&ra).unwrap_err()),
        "INVALID_HANDLE.SESSION_CHANGED"
    );
    let mut ir = Caller::default().interrupt(InterruptType::All, None);
    ir.client_observed_server_side_session_id = Some(fake.clone());
    assert_eq!(
        condition(&f.manager.interrupt(&ir).unwrap_err()),
        "INVALID_HANDLE.SESSION_CHANGED"
    );
    // ReleaseExecute deliberately does not validate it (rx §1.5)
    let mut rel = release_all(&op_id());
    rel.client_observed_server_side_session_id = Some(fake);
    assert!(f.manager.release_execute(&rel).is_ok());
}

#[test]
fn rx_s29_release_session_allow_reconnect() {
    let f = ManualManager::default();
    let _ = start(&f.manager, &execute(&op_id()));
    let before = f
        .manager
        .server_side_session_id(&Caller::default().session_key())
        .unwrap();
    f.manager
        .release_session(&Caller::default().release_session(true));
    assert!(
        !f.manager
            .is_session_closed(&Caller::default().session_key())
    );
    assert_eq!(f.manager.execution_count(), 0);
    let _ = start(&f.manager, &execute(&op_id()));
    let after = f
        .manager
        .server_side_session_id(&Caller::default().session_key())
        .unwrap();
    assert_ne!(before, after);
}

#[test]
fn rx_s30_orphan_gets_error_instead_of_endless_reattach() {
    let f = ManualManager::new(rotating(1 << 30));
    let o = op_id();
    let (mut p, mut s) = start(&f.manager, &execute(&o));
    push_n(&mut p, 1, 1);
    let r1 = next(&mut s);
    f.clock.advance(Duration::from_secs(1));
    assert_eq!(s.try_next(), ConsumerEvent::End(StreamEnd::Rotated));
    drop(p); // the producer dies without completing
    let e = f
        .manager
        .reattach_execute(&reattach(&o, Some(&r1.response_id)))
        .unwrap_err();
    assert!(matches!(e, ConnectError::Orphaned { .. }), "{e}");
    assert_eq!(f.manager.execution_count(), 0);
    let e = f
        .manager
        .reattach_execute(&reattach(&o, Some(&r1.response_id)))
        .unwrap_err();
    assert_eq!(condition(&e), "INVALID_HANDLE.OPERATION_NOT_FOUND");
}

#[test]
fn rx_s31_duplicate_operation_ids() {
    let f = ManualManager::default();
    let o = op_id();
    let (mut p, mut s) = start(&f.manager, &execute(&o));
    push_n(&mut p, 1, 2);
    next(&mut s);
    // active, different plan
    let mut other = execute(&o);
    other.plan = Some(Plan::root(Bytes::from_static(b"SELECT 2")));
    let e = f.manager.execute_plan(&other).unwrap_err();
    assert_eq!(
        e,
        ConnectError::OperationAlreadyExists { handle: o.clone() }
    );
    assert!(e.message().contains(&o));
    // active, same plan: reattach from the start, preempting the first stream
    let Submitted::Reattached(mut again) = f.manager.execute_plan(&execute(&o)).unwrap() else {
        panic!("expected a reattach")
    };
    assert_eq!(expect_err(&mut s), ConnectError::Disconnected);
    assert_eq!(rows(&next(&mut again)), Some(1));
    p.finish().unwrap();
    drain(&mut again);
    f.manager.release_execute(&release_all(&o)).unwrap();
    // released/completed: 4.3.0 answers OPERATION_ABANDONED while remembered
    let e = f.manager.execute_plan(&other).unwrap_err();
    assert_eq!(condition(&e), "INVALID_HANDLE.OPERATION_ABANDONED");
    f.clock.advance(Duration::from_secs(30 * 60));
    assert!(f.manager.execute_plan(&other).is_ok());
}

#[test]
fn rx_s32_interrupt_tag_requires_tag() {
    let f = ManualManager::default();
    let _ = start(&f.manager, &execute(&op_id()));
    let e = f
        .manager
        .interrupt(&Caller::default().interrupt(InterruptType::Tag, None))
        .unwrap_err();
    assert_eq!(e, ConnectError::InterruptTagRequiresTag);
    assert_eq!(
        condition(&e),
        "INVALID_PARAMETER_VALUE.INTERRUPT_TYPE_TAG_REQUIRES_TAG"
    );
}

#[test]
fn rx_s33_interrupt_operation_id_requires_id() {
    let f = ManualManager::default();
    let _ = start(&f.manager, &execute(&op_id()));
    let e = f
        .manager
        .interrupt(&Caller::default().interrupt(
            InterruptType::OperationId,
            Some(interrupt_request::Interrupt::OperationTag("t".into())),
        ))
        .unwrap_err();
    assert_eq!(
        condition(&e),
        "INVALID_PARAMETER_VALUE.INTERRUPT_TYPE_OPERATION_ID_REQUIRES_ID"
    );
    let e = f
        .manager
        .interrupt(&Caller::default().interrupt(InterruptType::Unspecified, None))
        .unwrap_err();
    assert_eq!(condition(&e), "UNSUPPORTED_FEATURE.INTERRUPT_TYPE");
}

// ---------------------------------------------------------------------------------------------
// rx §7.3 SparkConnectExecutionManagerSuite / SparkConnectExecuteHolderSuite
// ---------------------------------------------------------------------------------------------

#[test]
fn rx_s34_abandoned_removal_leaves_tombstone() {
    let f = ManualManager::default();
    let o = op_id();
    let (_p, s) = start(&f.manager, &execute(&o));
    drop(s);
    f.clock.advance(Duration::from_secs(300));
    assert_eq!(f.manager.maintain().abandoned, 1);
    assert_eq!(f.manager.abandoned_keys(), vec![key(&o)]);
}

#[test]
fn rx_s35_released_removal_leaves_no_tombstone() {
    let f = ManualManager::default();
    let o = op_id();
    let (_p, _s) = start(&f.manager, &execute(&o));
    f.manager.release_execute(&release_all(&o)).unwrap();
    f.clock.advance(Duration::from_secs(3600));
    f.manager.maintain();
    assert!(f.manager.abandoned_keys().is_empty());
}

#[test]
fn rx_s36_abandoned_operation_is_remembered() {
    let f = ManualManager::new(ManagerConfig {
        abandoned_tombstones: 0,
        ..ManagerConfig::default()
    });
    let o = op_id();
    let (_p, s) = start(&f.manager, &execute(&o));
    drop(s);
    f.clock.advance(Duration::from_secs(300));
    f.manager.maintain();
    // no tombstone room, but the session still remembers the id as inactive
    assert!(!f.manager.is_abandoned(&key(&o)));
    let e = f.manager.execute_plan(&execute(&o)).unwrap_err();
    assert_eq!(condition(&e), "INVALID_HANDLE.OPERATION_ABANDONED");
}

#[test]
fn rx_s37_active_then_inactive_after_release() {
    let f = ManualManager::default();
    let o = op_id();
    let (p, _s) = start(&f.manager, &execute(&o));
    assert!(f.manager.lookup(&key(&o)).is_some());
    p.finish().unwrap();
    f.manager.release_execute(&release_all(&o)).unwrap();
    assert!(f.manager.lookup(&key(&o)).is_none());
    assert_eq!(
        condition(&f.manager.execute_plan(&execute(&o)).unwrap_err()),
        "INVALID_HANDLE.OPERATION_ABANDONED"
    );
    assert_eq!(
        condition(&f.manager.reattach_execute(&reattach(&o, None)).unwrap_err()),
        "INVALID_HANDLE.OPERATION_NOT_FOUND"
    );
}

#[test]
fn rx_s38_interrupt_before_start_keeps_later_interrupts_working() {
    let f = ManualManager::default();
    let (o1, o2) = (op_id(), op_id());
    let Submitted::Reattachable(init) = f.manager.execute_plan(&execute(&o1)).unwrap() else {
        panic!()
    };
    let r = f.manager.interrupt(&interrupt_op(&o1)).unwrap();
    assert_eq!(r.interrupted_ids, vec![o1.clone()]);
    let (_h, mut p, mut s) = init.start();
    assert_eq!(p.try_push(batch(1)), Err(ProduceError::Cancelled));
    assert_eq!(expect_err(&mut s), ConnectError::OperationCanceled);
    let (_p2, mut s2) = start(&f.manager, &execute(&o2));
    let r = f.manager.interrupt(&interrupt_op(&o2)).unwrap();
    assert_eq!(r.interrupted_ids, vec![o2]);
    assert_eq!(expect_err(&mut s2), ConnectError::OperationCanceled);
}

// ---------------------------------------------------------------------------------------------
// rx §7.5 / §7.6 scenarios with a server-side outcome
// ---------------------------------------------------------------------------------------------

#[test]
fn rx_s54_release_session_twice_then_new_query_is_closed() {
    let f = ManualManager::default();
    let (o1, o2) = (op_id(), op_id());
    let (mut p1, mut s1) = start(&f.manager, &execute(&o1));
    let (mut p2, mut s2) = start(&f.manager, &execute(&o2));
    push_n(&mut p1, 1, 10);
    push_n(&mut p2, 1, 10);
    next(&mut s1);
    next(&mut s2);
    f.manager
        .release_session(&Caller::default().release_session(false));
    f.manager
        .release_session(&Caller::default().release_session(false));
    assert_eq!(f.manager.execution_count(), 0);
    for s in [&mut s1, &mut s2] {
        let e = expect_err(s);
        assert!(matches!(
            e,
            ConnectError::Disconnected | ConnectError::OperationCanceled
        ));
    }
    assert_eq!(
        condition(&f.manager.execute_plan(&execute(&op_id())).unwrap_err()),
        "INVALID_HANDLE.SESSION_CLOSED"
    );
}

#[test]
fn rx_s58_operation_id_echoed_on_every_response() {
    let f = ManualManager::default();
    let o = op_id();
    let upper = o.to_uppercase();
    let (mut p, mut s) = start(&f.manager, &execute(&upper));
    push_n(&mut p, 1, 3);
    p.finish().unwrap();
    let (got, _) = drain(&mut s);
    assert_eq!(got.len(), 4);
    let server_side = f
        .manager
        .server_side_session_id(&Caller::default().session_key())
        .unwrap();
    let mut ids = std::collections::HashSet::new();
    for r in &got {
        assert_eq!(r.operation_id, o, "canonical lower case");
        assert_eq!(r.session_id, SESSION_ID);
        assert_eq!(r.server_side_session_id, server_side);
        assert_eq!(
            Uuid::parse_str(&r.response_id).unwrap().get_version_num(),
            4
        );
        assert!(ids.insert(r.response_id.clone()));
    }
}

// ---------------------------------------------------------------------------------------------
// Issue 4 rules without an upstream scenario number
// ---------------------------------------------------------------------------------------------

#[test]
fn rx_x_uppercase_operation_id_works_end_to_end() {
    let f = ManualManager::default();
    let o = op_id();
    let up = o.to_uppercase();
    let (mut p, mut s) = start(&f.manager, &execute(&up));
    push_n(&mut p, 1, 2);
    let r1 = next(&mut s);
    let mut s2 = f
        .manager
        .reattach_execute(&reattach(&up, Some(&r1.response_id)))
        .unwrap();
    assert_eq!(rows(&next(&mut s2)), Some(2));
    f.manager
        .release_execute(&release_until(&up, &r1.response_id))
        .unwrap();
    assert_eq!(
        f.manager
            .interrupt(&interrupt_op(&up))
            .unwrap()
            .interrupted_ids,
        vec![o.clone()]
    );
    let r = f.manager.release_execute(&release_all(&up)).unwrap();
    assert_eq!(r.operation_id.as_deref(), Some(o.as_str()));
}

/// Measured on Spark 4.3.0 (connect §2): ExecutePlan rejects an operation id that is no
/// UUID with `INVALID_HANDLE.FORMAT`; elsewhere such an id names no execution.
#[test]
fn rx_x_non_uuid_operation_ids_are_format_errors_only_on_execute() {
    let f = ManualManager::default();
    let e = f.manager.execute_plan(&execute("not-a-uuid")).unwrap_err();
    assert_eq!(
        e,
        ConnectError::InvalidHandleFormat {
            handle: "not-a-uuid".into()
        }
    );
    let e = f
        .manager
        .execute_plan(&Caller::new(USER, "bad-session").execute_with(&op_id(), true))
        .unwrap_err();
    assert_eq!(condition(&e), "INVALID_HANDLE.FORMAT");
    let _ = start(&f.manager, &execute(&op_id()));
    let e = f
        .manager
        .reattach_execute(&reattach("nope", None))
        .unwrap_err();
    assert_eq!(
        e,
        ConnectError::OperationNotFound {
            handle: "nope".into()
        }
    );
    let r = f.manager.release_execute(&release_all("nope")).unwrap();
    assert_eq!(r.operation_id, None);
    let r = f.manager.interrupt(&interrupt_op("nope")).unwrap();
    assert!(r.interrupted_ids.is_empty());
    assert_eq!(
        f.manager.execution_count(),
        1,
        "nothing released or interrupted"
    );
}

#[test]
fn rx_x_unknown_session_is_not_found_and_not_created() {
    let f = ManualManager::default();
    let o = op_id();
    assert_eq!(
        condition(&f.manager.reattach_execute(&reattach(&o, None)).unwrap_err()),
        "INVALID_HANDLE.SESSION_NOT_FOUND"
    );
    assert_eq!(
        condition(&f.manager.release_execute(&release_all(&o)).unwrap_err()),
        "INVALID_HANDLE.SESSION_NOT_FOUND"
    );
    assert_eq!(f.manager.stats().sessions, 0);
}

/// Spark's Interrupt gets or creates its session (connect §3): PySpark's `interruptAll()` on
/// a fresh session succeeds with nothing interrupted, and the session then exists with one
/// server-side id that later RPCs see too.
#[test]
fn rx_x_interrupt_gets_or_creates_its_session() {
    let f = ManualManager::default();
    let r = f.manager.interrupt(&interrupt_op(&op_id())).unwrap();
    assert!(r.interrupted_ids.is_empty());
    assert_eq!(f.manager.stats().sessions, 1);
    assert!(!r.server_side_session_id.is_empty());
    let again = f
        .manager
        .get_or_create_session(USER, SESSION_ID, Some(&r.server_side_session_id));
    assert_eq!(again.unwrap(), r.server_side_session_id);
    let changed = f
        .manager
        .get_or_create_session(USER, SESSION_ID, Some("other"))
        .unwrap_err();
    assert_eq!(condition(&changed), "INVALID_HANDLE.SESSION_CHANGED");
}

#[test]
fn rx_x_release_of_unknown_operation_succeeds_unset() {
    let f = ManualManager::default();
    let _ = start(&f.manager, &execute(&op_id()));
    let r = f.manager.release_execute(&release_all(&op_id())).unwrap();
    assert_eq!(r.operation_id, None);
    assert_eq!(r.session_id, SESSION_ID);
    let mut none = release_all(&op_id());
    none.release = None;
    assert!(
        f.manager
            .release_execute(&none)
            .unwrap()
            .operation_id
            .is_none()
    );
    let o = op_id();
    let _ = start(&f.manager, &execute(&o));
    let mut none = release_all(&o);
    none.release = None;
    assert_eq!(
        f.manager.release_execute(&none).unwrap_err(),
        ConnectError::UnknownReleaseType
    );
}

#[test]
fn rx_x_reattach_position_table() {
    let f = ManualManager::default();
    let o = op_id();
    let (mut p, mut s) = start(&f.manager, &execute(&o));
    push_n(&mut p, 1, 3);
    let r1 = next(&mut s);
    let r2 = next(&mut s);
    // unknown id and empty string: POSITION_NOT_FOUND, and nothing was preempted
    for bad in [Uuid::new_v4().to_string(), String::new(), "junk".into()] {
        let e = f
            .manager
            .reattach_execute(&reattach(&o, Some(&bad)))
            .unwrap_err();
        assert_eq!(e, ConnectError::PositionNotFound { response_id: bad });
    }
    assert_eq!(rows(&next(&mut s)), Some(3));
    // known id: the next index
    let mut s2 = f
        .manager
        .reattach_execute(&reattach(&o, Some(&r1.response_id)))
        .unwrap();
    assert_eq!(next(&mut s2).response_id, r2.response_id);
    // none: index 1
    let mut s3 = f.manager.reattach_execute(&reattach(&o, None)).unwrap();
    assert_eq!(next(&mut s3).response_id, r1.response_id);
    // at the end of a finished log: complete at once
    p.finish().unwrap();
    let (all, _) = drain(&mut s3);
    let last = all.last().unwrap().response_id.clone();
    let mut s4 = f
        .manager
        .reattach_execute(&reattach(&o, Some(&last)))
        .unwrap();
    assert_eq!(s4.try_next(), ConsumerEvent::End(StreamEnd::Complete));
}

#[test]
fn rx_x_at_end_redelivers_terminal_error() {
    let f = ManualManager::default();
    let o = op_id();
    let (mut p, mut s) = start(&f.manager, &execute(&o));
    push_n(&mut p, 1, 1);
    p.fail(ConnectError::failed("[DIVIDE_BY_ZERO] boom"))
        .unwrap();
    let r1 = next(&mut s);
    assert_eq!(expect_err(&mut s).message(), "[DIVIDE_BY_ZERO] boom");
    for _ in 0..2 {
        let mut again = f
            .manager
            .reattach_execute(&reattach(&o, Some(&r1.response_id)))
            .unwrap();
        assert_eq!(expect_err(&mut again).message(), "[DIVIDE_BY_ZERO] boom");
    }
    assert!(
        f.manager
            .release_execute(&release_all(&o))
            .unwrap()
            .operation_id
            .is_some()
    );
}

#[test]
fn rx_x_interrupt_detached_then_release_all_succeeds() {
    let f = ManualManager::new(rotating(1 << 30));
    let (o, tagged) = (op_id(), op_id());
    let (mut p, mut s) = start(&f.manager, &execute(&o));
    let mut treq = execute(&tagged);
    treq.tags = vec!["etl".into()];
    let (_tp, _ts) = start(&f.manager, &treq);
    push_n(&mut p, 1, 2);
    let r1 = next(&mut s);
    f.clock.advance(Duration::from_secs(1));
    assert_eq!(s.try_next(), ConsumerEvent::End(StreamEnd::Rotated));
    // detached by rotation; interrupt by tag does not touch it, interrupt all does
    let r = f
        .manager
        .interrupt(&Caller::default().interrupt(
            InterruptType::Tag,
            Some(interrupt_request::Interrupt::OperationTag("etl".into())),
        ))
        .unwrap();
    assert_eq!(r.interrupted_ids, vec![tagged.clone()]);
    let r = f
        .manager
        .interrupt(&Caller::default().interrupt(InterruptType::All, None))
        .unwrap();
    assert_eq!(r.interrupted_ids, vec![o.clone()]);
    let mut s2 = f
        .manager
        .reattach_execute(&reattach(&o, Some(&r1.response_id)))
        .unwrap();
    assert_eq!(rows(&next(&mut s2)), Some(2));
    assert_eq!(expect_err(&mut s2), ConnectError::OperationCanceled);
    let r = f.manager.release_execute(&release_all(&o)).unwrap();
    assert_eq!(r.operation_id.as_deref(), Some(o.as_str()));
}

#[test]
fn rx_x_interrupt_after_completion_is_noop() {
    let f = ManualManager::default();
    let o = op_id();
    let (mut p, mut s) = start(&f.manager, &execute(&o));
    push_n(&mut p, 1, 1);
    p.finish().unwrap();
    assert!(
        f.manager
            .interrupt(&interrupt_op(&o))
            .unwrap()
            .interrupted_ids
            .is_empty()
    );
    let (got, end) = drain(&mut s);
    assert!(got.last().unwrap().is_result_complete());
    assert_eq!(end, ConsumerEvent::End(StreamEnd::Complete));
}

#[test]
fn rx_x_non_reattachable_has_one_stream_and_is_released_at_its_end() {
    let f = ManualManager::default();
    let o = op_id();
    let (mut p, mut s) = start(&f.manager, &Caller::default().execute_with(&o, false));
    assert!(!s.is_reattachable());
    assert_eq!(
        f.manager.reattach_execute(&reattach(&o, None)).unwrap_err(),
        ConnectError::NotReattachable
    );
    assert_eq!(
        f.manager.release_execute(&release_all(&o)).unwrap_err(),
        ConnectError::NotReattachable
    );
    push_n(&mut p, 1, 2);
    p.finish().unwrap();
    let (got, end) = drain(&mut s);
    assert_eq!(got.len(), 2);
    assert!(got.iter().all(|r| !r.is_result_complete()));
    assert_eq!(end, ConsumerEvent::End(StreamEnd::Complete));
    assert_eq!(f.manager.execution_count(), 0);
    // dropping a non-reattachable stream early releases it too, and stops the producer
    let o2 = op_id();
    let (p2, s2) = start(&f.manager, &Caller::default().execute_with(&o2, false));
    drop(s2);
    assert_eq!(f.manager.execution_count(), 0);
    assert!(p2.is_cancelled());
}

#[test]
fn rx_x_session_expiry_and_refresh() {
    // no rotation: the execution stays attached, only the session expiry can end it
    let f = ManualManager::new(ManagerConfig {
        stream: StreamLimits {
            max_duration: None,
            max_bytes: None,
        },
        ..ManagerConfig::default()
    });
    let o = op_id();
    let (mut p, mut s) = start(&f.manager, &execute(&o));
    push_n(&mut p, 1, 1);
    let r1 = next(&mut s);
    f.clock.advance(Duration::from_secs(59 * 60));
    f.manager
        .release_execute(&release_until(&o, &r1.response_id))
        .unwrap();
    f.clock.advance(Duration::from_secs(59 * 60));
    assert_eq!(f.manager.maintain().sessions_expired, 0);
    f.clock.advance(Duration::from_secs(60));
    let report = f.manager.maintain();
    assert_eq!(report.sessions_expired, 1);
    assert_eq!(report.abandoned_with_sessions, 1);
    assert!(f.manager.is_abandoned(&key(&o)));
    assert_eq!(expect_err(&mut s), ConnectError::Disconnected);
    assert_eq!(
        condition(&f.manager.reattach_execute(&reattach(&o, None)).unwrap_err()),
        "INVALID_HANDLE.SESSION_CLOSED"
    );
}

#[test]
fn rx_x_per_session_cap() {
    let f = ManualManager::new(ManagerConfig {
        max_executions_per_session: 2,
        ..ManagerConfig::default()
    });
    let _a = start(&f.manager, &execute(&op_id()));
    let _b = start(&f.manager, &execute(&op_id()));
    let e = f.manager.execute_plan(&execute(&op_id())).unwrap_err();
    assert_eq!(condition(&e), "EXECUTION_LIMIT_EXCEEDED");
    assert_eq!(e.code(), tether::execution::Code::ResourceExhausted);
    assert_eq!(f.manager.execution_count(), 2);
    // another session is not affected
    assert!(
        f.manager
            .execute_plan(&Caller::new(USER, OTHER_SESSION_ID).execute_with(&op_id(), true))
            .is_ok()
    );
}

#[test]
fn rx_x_invalid_tags_register_nothing() {
    let f = ManualManager::default();
    for tag in ["", "a,b"] {
        let mut r = execute(&op_id());
        r.tags = vec!["ok".into(), tag.into()];
        let e = f.manager.execute_plan(&r).unwrap_err();
        assert!(matches!(e, ConnectError::InvalidTag { .. }), "{e}");
    }
    assert_eq!(f.manager.execution_count(), 0);
}

#[test]
fn rx_x_unstarted_submission_dropped_is_released() {
    let f = ManualManager::default();
    let o = op_id();
    drop(f.manager.execute_plan(&execute(&o)).unwrap());
    assert_eq!(f.manager.execution_count(), 0);
    assert!(!f.manager.is_abandoned(&key(&o)));
}

#[tokio::test(start_paused = true)]
async fn rx_x_preemption_is_prompt_while_transport_blocked() {
    let f = ManualManager::default();
    let o = op_id();
    let (mut p, s) = start(&f.manager, &execute(&o));
    push_n(&mut p, 1, 1);
    // a sink that never becomes ready (a full transport window)
    let forward = tokio::spawn(async move {
        let mut sink = NeverReady;
        s.forward(&mut sink).await
    });
    tokio::task::yield_now().await;
    let _s2 = f.manager.reattach_execute(&reattach(&o, None)).unwrap();
    let out = tokio::time::timeout(Duration::from_millis(10), forward)
        .await
        .expect("preempted consumer must end promptly")
        .unwrap();
    assert!(matches!(
        out,
        Err(ForwardError::Connect(ConnectError::Disconnected))
    ));
}

struct NeverReady;

impl futures::Sink<ExecutePlanResponse> for NeverReady {
    type Error = std::convert::Infallible;
    fn poll_ready(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Pending
    }
    fn start_send(
        self: std::pin::Pin<&mut Self>,
        _: ExecutePlanResponse,
    ) -> Result<(), Self::Error> {
        Ok(())
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_close(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }
}

#[tokio::test(start_paused = true)]
async fn rx_x_blocked_transport_rotates_at_deadline() {
    let f = ManualManager::new(rotating(1 << 30));
    let o = op_id();
    let (mut p, s) = start(&f.manager, &execute(&o));
    push_n(&mut p, 1, 1);
    let mut sink = NeverReady;
    let forward = s.forward(&mut sink);
    futures::pin_mut!(forward);
    assert!(futures::poll!(&mut forward).is_pending());
    f.clock.advance(Duration::from_secs(1));
    let end = forward.await.unwrap();
    assert_eq!(end, StreamEnd::Rotated);
    // nothing was sent: a reattach from the start gets response 1
    let mut s2 = f.manager.reattach_execute(&reattach(&o, None)).unwrap();
    assert_eq!(rows(&next(&mut s2)), Some(1));
}

#[tokio::test(start_paused = true)]
async fn rx_x_maintenance_loop_abandons_on_schedule() {
    let f = ManualManager::default();
    let o = op_id();
    let (_p, s) = start(&f.manager, &execute(&o));
    drop(s);
    let task = tokio::spawn(f.manager.clone().run_maintenance());
    for _ in 0..12 {
        tokio::task::yield_now().await;
        f.clock.advance(Duration::from_secs(30));
        tokio::task::yield_now().await;
    }
    assert_eq!(f.manager.execution_count(), 0);
    assert!(f.manager.is_abandoned(&key(&o)));
    task.abort();
}

/// `Duration::MAX` as "never" for the detached timeout and the inactive-id expiry: a
/// maintenance pass neither abandons nor forgets anything, and never panics on the addition
/// (time::deadline_after saturates).
#[test]
fn duration_max_manager_timeouts_never_fire_and_never_panic() {
    let f = ManualManager::new(ManagerConfig {
        detached_timeout: Duration::MAX,
        inactive_operation_expiry: Duration::MAX,
        session_timeout: None,
        ..ManagerConfig::default()
    });
    let detached = op_id();
    let (mut p, mut s) = start(&f.manager, &execute(&detached));
    push_n(&mut p, 1, 2);
    next(&mut s);
    f.clock.advance(Duration::from_secs(121));
    assert_eq!(s.try_next(), ConsumerEvent::End(StreamEnd::Rotated));
    let released = op_id();
    let (_p2, _s2) = start(&f.manager, &execute(&released));
    f.manager
        .release_execute(&Caller::default().release_all(&released))
        .unwrap();
    f.clock.advance(Duration::from_secs(3600 * 24 * 365));
    assert_eq!(f.manager.maintain().abandoned, 0);
    assert_eq!(f.manager.execution_count(), 1);
    let e = f
        .manager
        .execute_plan(&Caller::default().execute_with(&released, true))
        .unwrap_err();
    assert_eq!(condition(&e), "INVALID_HANDLE.OPERATION_ABANDONED");
}
