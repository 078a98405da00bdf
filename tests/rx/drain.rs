//! Graceful drain of an execution manager (tether's own; docs/deployment.md): new sessions
//! and executions are refused with the retryable `SERVER_DRAINING`, everything live is
//! served as before, and `interrupt_all` ends what a deadline leaves running with Spark's
//! `OPERATION_CANCELED` after the responses produced before it.

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
    f.manager.drain();
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
fn interrupt_all_cancels_what_still_runs_after_its_responses() {
    let f = ManualManager::default();
    let c = Caller::default();
    let other = Caller::new("u2", &uuid::Uuid::new_v4().to_string());
    let (running, done) = (op_id(), op_id());
    let (mut p_run, mut s_run) = start(&f.manager, &c.execute(&running));
    let (mut p_done, mut s_done) = start(&f.manager, &other.execute(&done));
    push_n(&mut p_run, 1, 1);
    push_n(&mut p_done, 1, 1);
    p_done.finish().unwrap();
    f.manager.drain();
    let interrupted = f.manager.interrupt_all();
    assert_eq!(interrupted, vec![c.key(&running)], "only the running one");
    assert_eq!(rows(&next(&mut s_run)), Some(1), "its response first");
    assert_eq!(expect_err(&mut s_run), ConnectError::OperationCanceled);
    assert!(p_run.is_cancelled());
    assert_eq!(p_run.try_push(batch(2)), Err(ProduceError::Cancelled));
    // The completed one is read to its end as before.
    let (got, end) = drain(&mut s_done);
    assert_eq!(got.len(), 2, "a batch and ResultComplete: {got:?}");
    assert!(matches!(end, ConsumerEvent::End(_)), "{end:?}");
    // Interrupting again interrupts nothing; both stay registered until released.
    assert!(f.manager.interrupt_all().is_empty());
    assert_eq!(f.manager.execution_count(), 2);
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
