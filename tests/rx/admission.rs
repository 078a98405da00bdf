//! Admission (tether's; SPARK-49580's proposal): a server-wide and a per-user cap on running
//! executions, FIFO waiting timed on the manager's clock, `SERVER_BUSY` after the longest
//! wait and `SERVER_DRAINING` once the server drains; both `UNAVAILABLE`, which clients
//! retry.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::task::noop_waker_ref;
use tether::execution::{AdmissionConfig, AdmissionWait, Code, ConnectError, ManagerConfig};
use tether_testing::connect::ManualManager;

fn capped(max: usize, per_user: Option<usize>, wait: Option<Duration>) -> ManualManager {
    ManualManager::new(ManagerConfig {
        admission: AdmissionConfig {
            max_running: Some(max),
            max_running_per_user: per_user,
            max_wait: wait,
        },
        ..ManagerConfig::default()
    })
}

fn poll(wait: &mut Pin<Box<AdmissionWait>>) -> Poll<<AdmissionWait as Future>::Output> {
    wait.as_mut()
        .poll(&mut Context::from_waker(noop_waker_ref()))
}

#[test]
fn executions_beyond_the_cap_wait_and_are_admitted_in_fifo_order() {
    let f = capped(2, None, None);
    let mut running: Vec<_> = (0..2)
        .map(|_| {
            let mut w = Box::pin(f.manager.admit("u"));
            match poll(&mut w) {
                Poll::Ready(Ok(p)) => p,
                other => panic!("{other:?}"),
            }
        })
        .collect();
    let mut queued: Vec<_> = (0..3).map(|_| Box::pin(f.manager.admit("u"))).collect();
    for w in &mut queued {
        assert!(poll(w).is_pending());
    }
    // Each slot freed admits the oldest waiter, and only it.
    for i in 0..3 {
        drop(running.remove(0));
        let Poll::Ready(Ok(permit)) = poll(&mut queued[i]) else {
            panic!("waiter {i} not admitted")
        };
        for later in &mut queued[i + 1..] {
            assert!(poll(later).is_pending());
        }
        running.push(permit);
    }
}

#[test]
fn a_waiter_is_refused_with_server_busy_after_the_longest_wait() {
    let f = capped(1, None, Some(Duration::from_secs(5)));
    let mut first = Box::pin(f.manager.admit("u"));
    let Poll::Ready(Ok(_held)) = poll(&mut first) else {
        panic!()
    };
    let mut second = Box::pin(f.manager.admit("u"));
    assert!(poll(&mut second).is_pending());
    f.clock.advance(Duration::from_millis(4_999));
    assert!(poll(&mut second).is_pending());
    f.clock.advance(Duration::from_millis(1));
    let Poll::Ready(Err(e)) = poll(&mut second) else {
        panic!("not refused")
    };
    assert_eq!(e.condition(), Some("SERVER_BUSY"));
    assert_eq!(e.code(), Code::Unavailable);
    assert!(matches!(e, ConnectError::ServerBusy { waited } if waited == Duration::from_secs(5)));
    assert!(e.message().starts_with("[SERVER_BUSY] "), "{}", e.message());
}

#[test]
fn draining_refuses_every_waiter_and_later_admissions() {
    let f = capped(1, None, None);
    let mut first = Box::pin(f.manager.admit("u"));
    let Poll::Ready(Ok(held)) = poll(&mut first) else {
        panic!()
    };
    let mut waiting = Box::pin(f.manager.admit("v"));
    assert!(poll(&mut waiting).is_pending());
    f.manager.refuse_new();
    assert!(matches!(
        poll(&mut waiting),
        Poll::Ready(Err(ConnectError::ServerDraining))
    ));
    drop(held);
    let mut later = Box::pin(f.manager.admit("w"));
    assert!(matches!(
        poll(&mut later),
        Poll::Ready(Err(ConnectError::ServerDraining))
    ));
}

#[test]
fn a_dropped_waiter_leaves_the_queue_and_its_slot_goes_on() {
    let f = capped(1, None, None);
    let mut first = Box::pin(f.manager.admit("u"));
    let Poll::Ready(Ok(held)) = poll(&mut first) else {
        panic!()
    };
    let mut gone = Box::pin(f.manager.admit("u"));
    let mut next = Box::pin(f.manager.admit("u"));
    assert!(poll(&mut gone).is_pending() && poll(&mut next).is_pending());
    drop(held); // admits `gone`, whose RPC has ended meanwhile:
    drop(gone); // its slot passes to `next`.
    assert!(matches!(poll(&mut next), Poll::Ready(Ok(_))));
}

#[test]
fn one_users_backlog_does_not_hold_back_another_user() {
    let f = capped(4, Some(1), None);
    let mut a1 = Box::pin(f.manager.admit("a"));
    let Poll::Ready(Ok(_a1)) = poll(&mut a1) else {
        panic!()
    };
    let mut a2 = Box::pin(f.manager.admit("a"));
    let mut b1 = Box::pin(f.manager.admit("b"));
    assert!(poll(&mut a2).is_pending());
    assert!(matches!(poll(&mut b1), Poll::Ready(Ok(_))));
}

#[test]
fn without_a_cap_everything_is_admitted_at_once() {
    let f = ManualManager::default();
    let permits: Vec<_> = (0..1000)
        .map(|_| {
            let mut w = Box::pin(f.manager.admit("u"));
            match poll(&mut w) {
                Poll::Ready(Ok(p)) => p,
                other => panic!("{other:?}"),
            }
        })
        .collect();
    assert_eq!(permits.len(), 1000);
}
