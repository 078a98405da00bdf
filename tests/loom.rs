//! Model checking with loom: every interleaving (up to `LOOM_MAX_PREEMPTIONS` preemptions)
//! of threads racing on tether's shared state. Built only with `--cfg tether_loom`, under
//! which the crate's locks and atomics are loom's (`src/sync.rs`); run with
//! `bash scripts/loom.sh`. Without the cfg this file is empty.
//!
//! Two targets, as the issue names them:
//!
//! - the finalize path of a worker session (udf §5.1): what several threads share is the
//!   worker handle's counters and the session's `TerminationWatch`. (The `finalized` flag
//!   itself is not shared: a session and its drop cleanup own it exclusively, so `close()`
//!   and a drop of the same session cannot run at once; what races is the close of one
//!   session, the drop of another on the same worker, the pool reading the worker, and the
//!   watchers.) The drop cleanup runs without a tokio runtime here, the synchronous path;
//!   the spawned cleanup task is not a target.
//! - the execution manager's lock-and-waker shell (rx §5.1): ReattachExecute racing
//!   Interrupt, ReleaseAll, a maintenance pass and ReleaseSession, and a producer racing its
//!   consumer at the unsent bound. The pure registry and cores are not targets; the
//!   clock is a `ManualClock` that no thread moves during a race.
//!
//! Every waiting thread waits through `loom::future::block_on`: a wake-up that is lost
//! leaves it blocked, which loom reports as a deadlock. Each test's doc names the bug it
//! would catch.
#![cfg(tether_loom)]

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use loom::thread;
use tether::connection::{MemoryConnection, pair};
use tether::execution::{
    ConnectError, ExecutionManager, LogConfig, ManagerConfig, ProduceError, Producer,
    ResponseStream,
};
use tether::time::ManualClock;
use tether::wire::{UdfRequest, UdfResponse};
use tether::worker::engine::{
    CountingHandle, Session, SessionConfig, TerminationKind, WorkerHandle,
};
use tether_testing::connect::{self, Caller, ManualManager, batch, condition, rows};

/// Runs `f` under loom with the bounds of the environment (`LOOM_MAX_PREEMPTIONS`, 3 in
/// `scripts/loom.sh`; `LOOM_MAX_BRANCHES` raised for the manager's many lock steps), and
/// prints how many interleavings it explored (seen with `--nocapture`).
fn model(name: &str, f: impl Fn() + Sync + Send + 'static) {
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut builder = loom::model::Builder::new();
    if std::env::var_os("LOOM_MAX_BRANCHES").is_none() {
        builder.max_branches = 10_000;
    }
    let counted = Arc::clone(&runs);
    builder.check(move || {
        counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        f();
    });
    let runs = runs.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("loom {name}: {runs} interleavings explored");
}

// ---------------------------------------------------------------------------------------------
// Worker sessions: the finalize path (udf §5.1)
// ---------------------------------------------------------------------------------------------

/// A session on `handle` that is never driven past `Init`: `close()` gives the synthetic
/// `Cancelled` (udf §5.3 first row) and a drop gives `Interrupted` (no timer: the
/// synchronous cleanup, worker invalidated). The worker end is returned so it stays open.
fn idle_session(
    handle: &Arc<CountingHandle>,
) -> (
    Session<tether::worker::state::Init, MemoryConnection<UdfRequest, UdfResponse>>,
    MemoryConnection<UdfResponse, UdfRequest>,
) {
    let (engine, worker) = pair::<UdfRequest, UdfResponse>(4);
    let config = SessionConfig::with_timer(Arc::new(tether::time::NoTimeouts));
    (Session::new(engine, Arc::clone(handle), config), worker)
}

/// `close()` of one session races the drop of another on the same worker, while a third
/// thread waits on both sessions' watches.
///
/// Invariants: each session settles one terminal (`Cancelled` for the closed one,
/// `Interrupted` for the dropped one) and every watcher sees it; the worker is released
/// exactly twice and ends with no session; it is invalid (the dropped session could not
/// prove it healthy, udf §4.9) and the handle saw both outcomes.
///
/// Bugs it catches: a release that loses a concurrent update of the session count (a load
/// then a store instead of one read-modify-write); a `TerminationWatch` that publishes
/// without waking a watcher that registered concurrently (the waker taken before the outcome
/// is stored, or checked and registered under two separate locks): the watcher never wakes.
#[test]
fn session_close_racing_drop_on_one_worker() {
    model("session_close_racing_drop_on_one_worker", || {
        let handle = Arc::new(CountingHandle::for_one_session());
        handle.acquire_session().unwrap();
        let (closed, _w1) = idle_session(&handle);
        let (dropped, _w2) = idle_session(&handle);
        let (closed_watch, dropped_watch) = (closed.watch(), dropped.watch());

        let closer = thread::spawn(move || loom::future::block_on(closed.close()));
        let dropper = thread::spawn(move || drop(dropped));
        let watched = (
            loom::future::block_on(closed_watch.clone().wait()),
            loom::future::block_on(dropped_watch.clone().wait()),
        );
        let returned = closer.join().unwrap();
        dropper.join().unwrap();

        assert_eq!(returned.kind(), TerminationKind::Cancelled);
        // The watch sees what close() returned (Termination has no `PartialEq`).
        assert_eq!(watched.0.kind(), returned.kind());
        assert_eq!(watched.0.to_string(), returned.to_string());
        assert_eq!(watched.1.kind(), TerminationKind::Interrupted);
        assert_eq!(
            dropped_watch.get().map(|t| t.kind()),
            Some(TerminationKind::Interrupted)
        );
        assert_eq!(handle.releases(), 2, "each session released exactly once");
        assert_eq!(handle.active_sessions(), 0);
        assert!(
            handle.is_invalid(),
            "the interrupted session invalidates the worker"
        );
        let mut kinds: Vec<_> = handle.outcomes().iter().map(|t| t.kind()).collect();
        kinds.sort_by_key(|k| *k as u8);
        assert_eq!(
            kinds,
            [TerminationKind::Cancelled, TerminationKind::Interrupted]
        );
    });
}

/// A dropped session's cleanup races the worker pool, which recycles a worker as soon as it
/// has no session left unless it is invalid (udf §6.5).
///
/// Invariant: whenever the pool sees the session released (count 0), it also sees the
/// worker invalid and the outcome recorded — `session_terminated`, then `mark_invalid`,
/// then `release_session` (udf §5.1 step 5). A cleanly closed session on a second worker
/// leaves that worker valid: invalidated iff it should be.
///
/// Bug it catches: finalize releasing before it marks the worker invalid (or recording the
/// outcome after the release), or the handle's atomics relaxed so the release can be seen
/// before the invalidation: the pool would hand an unsafe worker to the next session.
#[test]
fn session_drop_racing_pool_never_recycles_an_invalid_worker() {
    model(
        "session_drop_racing_pool_never_recycles_an_invalid_worker",
        || {
            let unsafe_worker = Arc::new(CountingHandle::for_one_session());
            let safe_worker = Arc::new(CountingHandle::for_one_session());
            let (dropped, _w1) = idle_session(&unsafe_worker);
            let (closed, _w2) = idle_session(&safe_worker);

            let dropper = thread::spawn(move || drop(dropped));
            let closer = thread::spawn(move || loom::future::block_on(closed.close()));
            // The pool looks at both workers while the sessions end.
            for _ in 0..2 {
                if unsafe_worker.active_sessions() == 0 {
                    assert!(unsafe_worker.is_invalid(), "released before marked invalid");
                    assert!(
                        unsafe_worker.last_outcome().is_some(),
                        "released before recorded"
                    );
                }
                if safe_worker.active_sessions() == 0 {
                    assert!(
                        safe_worker.last_outcome().is_some(),
                        "released before recorded"
                    );
                }
                assert!(
                    !safe_worker.is_invalid(),
                    "a cleanly closed session invalidated"
                );
                thread::yield_now();
            }
            dropper.join().unwrap();
            assert_eq!(closer.join().unwrap().kind(), TerminationKind::Cancelled);
            assert_eq!((unsafe_worker.releases(), safe_worker.releases()), (1, 1));
            assert!(unsafe_worker.is_invalid());
            assert!(!safe_worker.is_invalid());
        },
    );
}

// ---------------------------------------------------------------------------------------------
// Reattachable executions: the manager's lock-and-waker shell (rx §5.1)
// ---------------------------------------------------------------------------------------------

/// The one operation every race is about (a fixed id: each loom iteration replays the same
/// execution).
const OP: &str = "0d6b1c7e-5f2a-4e8b-9a31-7c4d2e9f0b15";

/// Who sends every request of the races: one user in one session (rx §1.9).
fn caller() -> Caller {
    Caller::new("loom", connect::SESSION_ID)
}

/// An execution manager with `config` on a manual clock that no racing thread moves.
fn manager(config: ManagerConfig) -> (ManualClock, ExecutionManager) {
    let ManualManager { clock, manager } = ManualManager::new(config);
    (clock, manager)
}

/// Registers and starts the execution `OP` (rx §2.2 T1); its first stream is dropped at
/// once, so the execution is detached (T4) until a ReattachExecute attaches.
fn start(m: &ExecutionManager) -> Producer {
    let (producer, stream) = connect::start(m, &caller().execute(OP));
    drop(stream);
    producer
}

fn reattach(m: &ExecutionManager) -> Result<ResponseStream, ConnectError> {
    m.reattach_execute(&caller().reattach(OP, None))
}

/// What one ReattachExecute saw: refused with an error condition, or a stream read to its
/// end — the batches (row counts), whether `ResultComplete` came, and the error it ended
/// with, if any.
#[derive(Debug, PartialEq)]
enum Attach {
    Refused(&'static str),
    Read {
        rows: Vec<i64>,
        complete: bool,
        error: Option<&'static str>,
    },
}

/// Reattaches and reads the stream to its end, waiting through loom (a stream nobody wakes
/// is a deadlock loom reports).
fn reattach_and_read(m: &ExecutionManager) -> Attach {
    let mut stream = match reattach(m) {
        Ok(stream) => stream,
        Err(e) => return Attach::Refused(condition(&e)),
    };
    let (mut got, mut complete) = (Vec::new(), false);
    loop {
        match loom::future::block_on(stream.next()) {
            Some(Ok(r)) if r.is_result_complete() => complete = true,
            Some(Ok(r)) => got.push(rows(&r).expect("an arrow batch")),
            Some(Err(e)) => {
                return Attach::Read {
                    rows: got,
                    complete,
                    error: Some(condition(&e)),
                };
            }
            None => {
                return Attach::Read {
                    rows: got,
                    complete,
                    error: None,
                };
            }
        }
    }
}

/// Races a ReattachExecute that reads its stream to the end (one thread) against
/// `action` (another), and with `waiter` a third thread waiting for that producer's cancel
/// signal; returns what the reader saw and what `action` returned.
fn race<T: Send + 'static>(
    m: &ExecutionManager,
    waiter: Option<Arc<Producer>>,
    action: impl FnOnce(&ExecutionManager) -> T + Send + 'static,
) -> (Attach, T) {
    let reader = {
        let m = m.clone();
        thread::spawn(move || reattach_and_read(&m))
    };
    let racer = {
        let m = m.clone();
        thread::spawn(move || action(&m))
    };
    let waiter = waiter.map(|p| thread::spawn(move || loom::future::block_on(p.cancelled())));
    let read = reader.join().unwrap();
    let out = racer.join().unwrap();
    if let Some(waiter) = waiter {
        waiter.join().unwrap();
    }
    (read, out)
}

/// ReattachExecute racing Interrupt (rx §5.5, §5.7), while the producer waits for the
/// cancel signal.
///
/// Invariants: the interrupt interrupts the running execution; the reattach is refused or
/// its stream delivers the response produced before the interrupt and then ends with
/// `OPERATION_CANCELED` — never an attached consumer left waiting; the producer's
/// `cancelled()` wakes and its next push is refused.
///
/// Bug it catches: SPARK-44855, an interrupted sender asleep on its wake-up that nobody
/// wakes (an interrupt that changes the phase but drops or forgets the consumer's waker,
/// or wakes before the phase change is visible under the lock): the reader never wakes.
#[test]
fn manager_reattach_racing_interrupt() {
    model("manager_reattach_racing_interrupt", || {
        let (_clock, m) = manager(ManagerConfig::default());
        let mut producer = start(&m);
        producer.try_push(batch(1)).unwrap();
        let producer = Arc::new(producer);

        let (read, response) = race(&m, Some(Arc::clone(&producer)), |m| {
            m.interrupt(&caller().interrupt_op(OP)).expect("interrupt")
        });

        assert_eq!(response.interrupted_ids, [OP]);
        assert_eq!(
            read,
            Attach::Read {
                rows: vec![1],
                complete: false,
                error: Some("OPERATION_CANCELED"),
            }
        );
        let mut producer = Arc::into_inner(producer).expect("the waiter is gone");
        assert_eq!(producer.try_push(batch(2)), Err(ProduceError::Cancelled));
    });
}

/// ReattachExecute racing ReleaseExecute(ReleaseAll) of a running execution (rx §5.5).
///
/// Invariants: the release removes the execution; the reattach is refused
/// (`OPERATION_NOT_FOUND`) or its stream ends with an error after the produced response —
/// no consumer stays attached to a released execution; the producer is told to stop.
///
/// Bug it catches: SPARK-50748 / SPARK-50889, a sender that can never exit after a cleanup
/// discarded the log: a release that closes the execution without waking its attached
/// consumer, or an attach that lands on an execution the release already closed and then
/// waits for responses that can no longer come.
#[test]
fn manager_reattach_racing_release_all() {
    model("manager_reattach_racing_release_all", || {
        let (_clock, m) = manager(ManagerConfig::default());
        let mut producer = start(&m);
        producer.try_push(batch(1)).unwrap();

        let (read, released) = race(&m, None, |m| {
            m.release_execute(&caller().release_all(OP))
                .expect("release")
        });

        assert_eq!(released.operation_id.as_deref(), Some(OP));
        match &read {
            Attach::Refused(c) => assert_eq!(*c, "INVALID_HANDLE.OPERATION_NOT_FOUND"),
            Attach::Read {
                rows,
                complete,
                error,
            } => {
                assert!(!complete, "nothing completed the execution");
                assert!(rows.is_empty() || rows == &[1], "rows {rows:?}");
                assert_eq!(*error, Some("INVALID_CURSOR.DISCONNECTED"));
            }
        }
        assert_eq!(m.execution_count(), 0);
        assert!(producer.is_cancelled());
        assert_eq!(producer.try_push(batch(2)), Err(ProduceError::Closed));
        assert!(
            matches!(reattach(&m), Err(e) if condition(&e) == "INVALID_HANDLE.OPERATION_NOT_FOUND")
        );
    });
}

/// ReattachExecute racing a maintenance pass that finds the execution detached past
/// `detached_timeout` (rx §5.3). The execution has completed, so a reader that attaches
/// reads it to its end.
///
/// Invariants: exactly one of the two wins. Either the pass abandons the execution (a
/// tombstone; the reattach is refused with `OPERATION_ABANDONED`), or the reattach attaches
/// first, an attached execution is never abandoned, and the reader gets every response
/// and `ResultComplete`.
///
/// Bug it catches: an attach outside the registry lock, or a pass that reads "detached
/// since" and closes the execution under two separate locks: a reader attached in between
/// is abandoned mid-stream (`DISCONNECTED` or a lost `ResultComplete`) although attached
/// executions must never be abandoned.
#[test]
fn manager_reattach_racing_maintenance() {
    model("manager_reattach_racing_maintenance", || {
        let config = ManagerConfig::default();
        let detached = config.detached_timeout;
        let (clock, m) = manager(config);
        let mut producer = start(&m);
        producer.try_push(batch(1)).unwrap();
        producer.finish().unwrap();
        clock.advance(detached + Duration::from_secs(1));

        let (read, report) = race(&m, None, ExecutionManager::maintain);

        match read {
            Attach::Refused(c) => {
                assert_eq!(c, "INVALID_HANDLE.OPERATION_ABANDONED");
                assert_eq!(report.abandoned, 1);
                assert_eq!(m.execution_count(), 0);
                assert_eq!(m.abandoned_keys().len(), 1);
            }
            read => {
                assert_eq!(
                    read,
                    Attach::Read {
                        rows: vec![1],
                        complete: true,
                        error: None,
                    }
                );
                assert_eq!(report.abandoned, 0, "an attached execution was abandoned");
                assert_eq!(m.execution_count(), 1);
            }
        }
    });
}

/// ReattachExecute racing ReleaseSession (rx §5.6) of the execution's session, while the
/// producer waits for the cancel signal.
///
/// Invariants: the session closes and its execution is removed as abandoned; the reattach
/// is refused (the session is closed) or its stream ends with an error after at most the
/// produced response — no consumer left attached after close; the producer's
/// `cancelled()` wakes and it is told to stop.
///
/// Bug it catches: SPARK-50748 through the session path: ReleaseSession closing its
/// executions without waking their consumers and producers (wakers collected but dropped
/// instead of woken after the lock), or an attach that slips into a session being closed.
#[test]
fn manager_reattach_racing_release_session() {
    model("manager_reattach_racing_release_session", || {
        let (_clock, m) = manager(ManagerConfig::default());
        let mut producer = start(&m);
        producer.try_push(batch(1)).unwrap();
        let producer = Arc::new(producer);

        let (read, closed) = race(&m, Some(Arc::clone(&producer)), |m| {
            m.release_session(&caller().release_session(false))
        });

        assert!(
            !closed.server_side_session_id.is_empty(),
            "the session existed"
        );
        match &read {
            Attach::Refused(c) => assert_eq!(*c, "INVALID_HANDLE.SESSION_CLOSED"),
            Attach::Read {
                rows,
                complete,
                error,
            } => {
                assert!(!complete);
                assert!(rows.is_empty() || rows == &[1], "rows {rows:?}");
                assert_eq!(*error, Some("INVALID_CURSOR.DISCONNECTED"));
            }
        }
        assert_eq!(m.execution_count(), 0);
        assert!(producer.is_cancelled());
    });
}

/// A producer racing its consumer at the unsent bound of one response (rx §3.2 with
/// tether's backpressure): the producer pushes three responses and finishes; the consumer
/// reads.
///
/// Invariants: every response reaches the consumer exactly once and in order, then
/// `ResultComplete`, then the end; neither side is left waiting.
///
/// Bug it catches: a lost wake-up in either direction of the lock-and-waker shell: the
/// consumer taking a response without waking the producer waiting at the bound, a push
/// that does not wake a consumer that registered its waker concurrently, or a waker
/// registered outside the lock that checked the state.
#[test]
fn manager_producer_racing_consumer_at_the_unsent_bound() {
    model(
        "manager_producer_racing_consumer_at_the_unsent_bound",
        || {
            let config = ManagerConfig {
                log: LogConfig {
                    max_unsent_responses: 1,
                    ..LogConfig::REATTACHABLE
                },
                ..ManagerConfig::default()
            };
            let (_clock, m) = manager(config);
            let mut producer = start(&m);

            let pusher = thread::spawn(move || {
                for i in 1..=3 {
                    loom::future::block_on(producer.push(batch(i))).expect("push");
                }
                producer.finish().expect("finish");
            });
            let read = reattach_and_read(&m);
            pusher.join().unwrap();

            assert_eq!(
                read,
                Attach::Read {
                    rows: vec![1, 2, 3],
                    complete: true,
                    error: None,
                }
            );
        },
    );
}
