//! Lifecycle events and metrics of worker sessions and of the dispatcher's worker processes
//! (`tether::worker::WorkerEvent`, `tether::observe`): a session's normal end, a failed init
//! and a cancel; a pooled dispatcher run with reuse, a worker SIGKILLed mid-session, an
//! idle worker found dead, one idle past its timeout and one exiting at start, whose
//! counters are exactly what the run caused and whose gauges return to 0; a worker marked
//! invalid mid-session, a session interrupted, a pooled worker that cannot open a session,
//! an idle worker whose channel went inactive (each invalidation reason); a full channel that drops and counts; a session made with `Session::new`,
//! which reports events and no metrics. The processes are real (this binary in worker mode,
//! see `dispatcher`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use futures::future::BoxFuture;
use tether::connection::pair;
use tether::observe::{EventReceiver, event_channel};
use tether::time::ManualClock;
use tether::wire::ProcessCallable;
use tether::wire::{UdfRequest, UdfResponse};
use tether::worker::dispatcher::{DispatchError, Dispatcher, DispatcherConfig, PoolConfig};
use tether::worker::endpoint::serve;
use tether::worker::engine::{
    CountingHandle, FramedTransport, Session, SessionConfig, TerminationKind, WorkerAddress,
    WorkerHandle, WorkerTransport,
};
use tether::worker::{StopReason, WorkerEvent, WorkerEventKind as K};
use tether_testing::echo::{EchoUdf, echo_config};
use tether_testing::fixtures::{INIT_FAILURE, direct_worker_spec, init, session_config_on};
use tether_testing::metrics::MetricTotals;

use crate::dispatcher::{
    config, echo_round, eventually, exists, pooled, recv_error, reusable, running, socket_of,
    tether_spec, worker_lost,
};

// ---------------------------------------------------------------------------------------
// The observed dispatcher and the readers.

/// A framed dispatcher of real echo workers, built with a recorder of its own installed and
/// an event channel of `capacity` in its session config.
struct Observed<T: WorkerTransport = FramedTransport> {
    d: Dispatcher<T>,
    rx: EventReceiver<WorkerEvent>,
    metrics: Arc<MetricTotals>,
}

impl Observed {
    fn new(spec: tether::wire::UdfWorkerSpecification, config: DispatcherConfig) -> Self {
        Self::with_capacity(spec, config, 1024)
    }

    fn with_capacity(
        spec: tether::wire::UdfWorkerSpecification,
        config: DispatcherConfig,
        capacity: usize,
    ) -> Self {
        Observed::over(spec, FramedTransport::default(), config, capacity)
    }
}

impl<T: WorkerTransport> Observed<T> {
    fn over(
        spec: tether::wire::UdfWorkerSpecification,
        transport: T,
        mut config: DispatcherConfig,
        capacity: usize,
    ) -> Self {
        let recorder = Arc::new(MetricTotals::default());
        let metrics = recorder.clone();
        let (tx, rx) = event_channel(capacity);
        config.events = Some(tx);
        let d = metrics::with_local_recorder(&*recorder, || {
            Dispatcher::new(spec, transport, config).expect("dispatcher")
        });
        Self { d, rx, metrics }
    }

    fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.metrics.get(name, labels)
    }

    /// Asserts that exactly one worker was invalidated, for `reason` (its metric label).
    fn invalidated_once(&self, reason: &str) {
        let metric = "tether_udf_workers_invalidated_total";
        assert_eq!(self.metric(metric, &[("reason", reason)]), 1.0, "{reason}");
        assert_eq!(self.metric(metric, &[]), 1.0, "one invalidation in all");
    }

    /// Every live gauge of the worker side (sessions, processes, idle pool).
    fn gauges(&self) -> [f64; 3] {
        [
            self.metric("tether_udf_sessions", &[]),
            self.metric("tether_udf_workers", &[]),
            self.metric("tether_udf_idle_workers", &[]),
        ]
    }
}

/// An event in a word: its kind and the outcome or reason it carries.
fn word(e: &WorkerEvent) -> String {
    match &e.kind {
        K::SessionCreated => "created".into(),
        K::SessionInitialized => "initialized".into(),
        K::SessionTerminated { termination } => format!("terminated:{:?}", termination.kind()),
        K::WorkerSpawned { .. } => "spawned".into(),
        K::WorkerReady { .. } => "ready".into(),
        K::WorkerReused => "reused".into(),
        K::WorkerInvalidated { reason } => format!("invalidated:{reason:?}"),
        K::WorkerStopped { reason } => format!("stopped:{reason:?}"),
        other => panic!("an event this suite does not know: {other:?}"),
    }
}

fn words(events: &[WorkerEvent]) -> Vec<String> {
    events.iter().map(word).collect()
}

/// The events of one worker, checked for the ids each kind carries (a session id on session
/// events only) and for their instants (never going back, on the sessions' clock).
fn of_worker<'a>(events: &'a [WorkerEvent], worker: &str) -> Vec<&'a WorkerEvent> {
    let mine: Vec<_> = events.iter().filter(|e| &*e.worker == worker).collect();
    for e in &mine {
        let session_event = matches!(
            e.kind,
            K::SessionCreated | K::SessionInitialized | K::SessionTerminated { .. }
        );
        assert_eq!(e.session.is_some(), session_event, "{e:?}");
    }
    for pair in mine.windows(2) {
        assert!(pair[0].at <= pair[1].at, "instants go back: {pair:?}");
    }
    mine
}

/// The one termination among `events`.
fn termination(events: &[WorkerEvent]) -> &tether::worker::engine::Termination {
    let mut found = events.iter().filter_map(|e| match &e.kind {
        K::SessionTerminated { termination } => Some(termination),
        _ => None,
    });
    let t = found.next().expect("a SessionTerminated");
    assert!(found.next().is_none(), "one SessionTerminated per session");
    t
}

// ---------------------------------------------------------------------------------------
// One session on a fresh worker: normal end, failed init, cancel.

#[tokio::test]
async fn a_finished_session_reports_its_states_and_its_worker_from_spawn_to_stop() {
    let mut o = Observed::new(tether_spec(), config());
    let s = o.d.create_session().await.unwrap();
    let (session, worker) = (s.id(), s.worker().id().to_string());
    let pid = o.d.worker(&worker).unwrap().pid;
    // Created and running: one live session on one live process, none idle.
    assert_eq!(o.gauges(), [1.0, 1.0, 0.0]);
    let (out, kind) = echo_round(s, &[b"a", b"b"]).await;
    assert_eq!((out.len(), kind), (2, TerminationKind::Finished));
    o.d.close().await;

    let events = o.rx.try_recv_all();
    assert_eq!(
        words(&events),
        after_a_finished_session(&["stopped:Released"])
    );
    assert_eq!(of_worker(&events, &worker).len(), events.len());
    assert!(
        events
            .iter()
            .filter(|e| e.session.is_some())
            .all(|e| e.session == Some(session))
    );
    match events[0].kind {
        K::WorkerSpawned { pid: p } => assert_eq!(p, pid),
        ref k => panic!("{k:?}"),
    }
    match events[1].kind {
        K::WorkerReady { startup } => {
            assert!(
                startup > Duration::ZERO && startup < Duration::from_secs(10),
                "{startup:?}"
            );
        }
        ref k => panic!("{k:?}"),
    }
    assert!(termination(&events).execution_error().is_none());

    assert_eq!(
        o.metric("tether_udf_sessions_total", &[("termination", "finished")]),
        1.0
    );
    assert_eq!(o.metric("tether_udf_sessions_total", &[]), 1.0);
    assert_eq!(o.metric("tether_udf_workers_spawned_total", &[]), 1.0);
    assert_eq!(
        o.metric(
            "tether_udf_workers_stopped_total",
            &[("reason", "released")]
        ),
        1.0
    );
    assert_eq!(o.metric("tether_udf_workers_stopped_total", &[]), 1.0);
    assert_eq!(o.metric("tether_udf_workers_reused_total", &[]), 0.0);
    assert_eq!(o.metric("tether_udf_workers_invalidated_total", &[]), 0.0);
    assert_eq!(
        o.metric("tether_udf_worker_startup_seconds", &[]),
        1.0,
        "one sample"
    );
    assert_eq!(
        o.metric("tether_events_dropped_total", &[("side", "udf")]),
        0.0
    );
    assert_eq!(o.gauges(), [0.0; 3]);
}

#[tokio::test]
async fn a_failed_init_is_terminated_cancelled_and_never_initialized() {
    let mut o = Observed::new(tether_spec(), config());
    let s = o.d.create_session().await.unwrap();
    let handle = s.worker().clone();
    let failed = s.init(init("INIT_ERROR")).await.expect_err("init fails");
    // Settled before close: already reported, while the session is still held.
    let before_close = o.rx.try_recv_all();
    assert_eq!(
        words(&before_close),
        ["spawned", "ready", "created", "terminated:Cancelled"]
    );
    let error = termination(&before_close)
        .execution_error()
        .expect("the worker's init error travels with the outcome");
    assert!(error.to_string().contains(INIT_FAILURE), "{error}");
    assert_eq!(o.metric("tether_udf_sessions", &[]), 0.0);
    assert_eq!(
        failed.session.close().await.kind(),
        TerminationKind::Cancelled
    );
    o.d.close().await;
    let after = o.rx.try_recv_all();
    assert_eq!(words(&after), ["stopped:Released"], "reported once");
    assert!(!handle.is_invalid(), "an init error is not a worker fault");

    assert_eq!(
        o.metric("tether_udf_sessions_total", &[("termination", "cancelled")]),
        1.0
    );
    assert_eq!(o.metric("tether_udf_sessions_total", &[]), 1.0);
    assert_eq!(o.metric("tether_udf_workers_invalidated_total", &[]), 0.0);
    assert_eq!(o.gauges(), [0.0; 3]);
}

#[tokio::test]
async fn a_cancelled_session_is_terminated_cancelled_and_its_worker_stays_valid() {
    let mut o = Observed::new(tether_spec(), config());
    let (mut s, _) =
        o.d.create_session()
            .await
            .unwrap()
            .init(init("udf"))
            .await
            .unwrap();
    s.send(Bytes::from_static(b"x")).await.unwrap();
    assert_eq!(s.recv().await.unwrap(), Some(Bytes::from_static(b"x")));
    let handle = s.worker().clone();
    let s = s
        .cancel(Some("the engine gave up".into()))
        .await
        .wait()
        .await;
    assert_eq!(s.outcome().kind(), TerminationKind::Cancelled);
    assert_eq!(s.close().await.kind(), TerminationKind::Cancelled);
    o.d.close().await;
    let events = o.rx.try_recv_all();
    assert_eq!(
        words(&events),
        [
            "spawned",
            "ready",
            "created",
            "initialized",
            "terminated:Cancelled",
            "stopped:Released"
        ]
    );
    assert!(termination(&events).execution_error().is_none());
    assert!(!handle.is_invalid());
    assert_eq!(
        o.metric("tether_udf_sessions_total", &[("termination", "cancelled")]),
        1.0
    );
    assert_eq!(o.metric("tether_udf_sessions_total", &[]), 1.0);
    assert_eq!(o.gauges(), [0.0; 3]);
}

// ---------------------------------------------------------------------------------------
// A pooled run: reuse, SIGKILL, a dead idle worker.

fn sigkill(pid: u32) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("SIGKILL");
}

#[tokio::test]
async fn a_pooled_run_with_reuse_and_a_sigkill_counts_exactly_what_it_caused() {
    let mut o = Observed::new(reusable(tether_spec()), pooled());

    // Two clean sessions on one worker: spawned once, reused once.
    let s = o.d.create_session().await.unwrap();
    let w1 = s.worker().id().to_string();
    let pid1 = o.d.worker(&w1).unwrap().pid;
    assert_eq!(echo_round(s, &[b"1"]).await.1, TerminationKind::Finished);
    assert_eq!(o.gauges(), [0.0, 1.0, 1.0], "one idle process");
    let s = o.d.create_session().await.unwrap();
    assert_eq!(s.worker().id(), w1);
    assert_eq!(o.gauges(), [1.0, 1.0, 0.0], "taken from the pool");
    assert_eq!(echo_round(s, &[b"2"]).await.1, TerminationKind::Finished);

    // A third session on it, SIGKILLed mid-stream: TransportFailed, invalidated, stopped.
    let (mut s, _) =
        o.d.create_session()
            .await
            .unwrap()
            .init(init("udf"))
            .await
            .unwrap();
    assert_eq!(s.worker().id(), w1, "reused again");
    s.send(Bytes::from_static(b"3")).await.unwrap();
    assert_eq!(s.recv().await.unwrap(), Some(Bytes::from_static(b"3")));
    sigkill(pid1);
    loop {
        let _ = s.send(Bytes::from_static(b"more")).await;
        match s.recv().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("a killed worker cannot finish"),
            Err(_) => break,
        }
    }
    assert_eq!(s.close().await.kind(), TerminationKind::TransportFailed);
    o.d.settle().await;
    assert!(!exists(pid1), "stopped and reaped");
    assert_eq!(o.gauges(), [0.0; 3], "nothing live between the runs");

    // A fourth session needs a new worker, which the close stops.
    let s = o.d.create_session().await.unwrap();
    let w2 = s.worker().id().to_string();
    assert_ne!(w2, w1);
    assert_eq!(echo_round(s, &[b"4"]).await.1, TerminationKind::Finished);
    assert_eq!(o.gauges(), [0.0, 1.0, 1.0]);
    let stats = o.d.stats();
    o.d.close().await;

    let events = o.rx.try_recv_all();
    assert_eq!(
        of_worker(&events, &w1)
            .into_iter()
            .map(word)
            .collect::<Vec<_>>(),
        after_a_finished_session(&[
            "reused",
            "created",
            "initialized",
            "terminated:Finished",
            "reused",
            "created",
            "initialized",
            "terminated:TransportFailed",
            "invalidated:TransportFailed",
            "stopped:Invalid"
        ])
    );
    assert_eq!(
        of_worker(&events, &w2)
            .into_iter()
            .map(word)
            .collect::<Vec<_>>(),
        after_a_finished_session(&["stopped:DispatcherClosed"])
    );
    assert_eq!(events.len(), 21, "no event of another worker");

    let m = |name: &str, labels: &[(&str, &str)]| o.metric(name, labels);
    assert_eq!((stats.spawned, stats.reused), (2, 2));
    assert_eq!(m("tether_udf_workers_spawned_total", &[]), 2.0);
    assert_eq!(m("tether_udf_workers_reused_total", &[]), 2.0);
    assert_eq!(m("tether_udf_worker_startup_seconds", &[]), 2.0);
    assert_eq!(
        m(
            "tether_udf_workers_invalidated_total",
            &[("reason", "transport_failed")]
        ),
        1.0
    );
    assert_eq!(m("tether_udf_workers_invalidated_total", &[]), 1.0);
    assert_eq!(
        m("tether_udf_workers_stopped_total", &[("reason", "invalid")]),
        1.0
    );
    assert_eq!(
        m("tether_udf_workers_stopped_total", &[("reason", "closed")]),
        1.0
    );
    assert_eq!(m("tether_udf_workers_stopped_total", &[]), 2.0);
    assert_eq!(
        m("tether_udf_sessions_total", &[("termination", "finished")]),
        3.0
    );
    assert_eq!(
        m(
            "tether_udf_sessions_total",
            &[("termination", "transport_failed")]
        ),
        1.0
    );
    assert_eq!(m("tether_udf_sessions_total", &[]), 4.0);
    assert_eq!(o.gauges(), [0.0; 3], "every gauge back to 0 after close");
}

#[tokio::test]
async fn an_idle_worker_found_dead_is_invalidated_as_exited_and_replaced() {
    let mut o = Observed::new(reusable(tether_spec()), pooled());
    let s = o.d.create_session().await.unwrap();
    let w1 = s.worker().id().to_string();
    let pid1 = o.d.worker(&w1).unwrap().pid;
    assert_eq!(echo_round(s, &[b"1"]).await.1, TerminationKind::Finished);
    assert_eq!(o.metric("tether_udf_idle_workers", &[]), 1.0);
    sigkill(pid1);
    eventually("the idle worker died", || !running(pid1)).await;

    let s = o.d.create_session().await.unwrap();
    let w2 = s.worker().id().to_string();
    assert_ne!(w2, w1, "the dead worker is not reused");
    assert_eq!(o.gauges(), [1.0, 1.0, 0.0]);
    let _ = s.close().await;
    o.d.close().await;

    let events = o.rx.try_recv_all();
    assert_eq!(
        of_worker(&events, &w1)
            .into_iter()
            .map(word)
            .collect::<Vec<_>>(),
        after_a_finished_session(&["invalidated:Exited", "stopped:Invalid"])
    );
    assert_eq!(o.metric("tether_udf_workers_reused_total", &[]), 0.0);
    assert_eq!(o.metric("tether_udf_workers_spawned_total", &[]), 2.0);
    o.invalidated_once("exited");
    assert_eq!(o.gauges(), [0.0; 3]);
}

/// A pooled worker killed while idle leaves the pool on its own, within the idle health
/// check's period: invalidated as `Exited` and stopped as invalid, the idle gauge back to
/// 0, long before its idle timeout (udf §6.6).
#[tokio::test]
async fn an_idle_worker_that_dies_leaves_the_pool_without_waiting_for_a_session() {
    let mut o = Observed::new(reusable(tether_spec()), pooled());
    let s = o.d.create_session().await.unwrap();
    let w = s.worker().id().to_string();
    let pid = o.d.worker(&w).unwrap().pid;
    assert_eq!(echo_round(s, &[b"1"]).await.1, TerminationKind::Finished);
    assert_eq!(o.gauges(), [0.0, 1.0, 1.0], "idle in the pool");
    sigkill(pid);
    eventually("the dead idle worker leaves the pool", || {
        o.d.workers().is_empty()
    })
    .await;
    o.d.settle().await;
    assert_eq!(o.gauges(), [0.0; 3], "neither idle nor running");
    assert!(!exists(pid), "reaped");
    let events = o.rx.try_recv_all();
    assert_eq!(
        words_of(&events, &w),
        after_a_finished_session(&["invalidated:Exited", "stopped:Invalid"])
    );
    o.invalidated_once("exited");
    o.d.close().await;
}

/// The words of a worker's events for one finished session on it, spawn to termination,
/// then `then`.
fn after_a_finished_session(then: &[&str]) -> Vec<String> {
    [
        "spawned",
        "ready",
        "created",
        "initialized",
        "terminated:Finished",
    ]
    .iter()
    .chain(then)
    .map(|w| (*w).to_owned())
    .collect()
}

/// The words of `worker`'s events in `events`.
fn words_of(events: &[WorkerEvent], worker: &str) -> Vec<String> {
    of_worker(events, worker).into_iter().map(word).collect()
}

#[tokio::test]
async fn a_worker_marked_invalid_mid_session_is_invalidated_as_marked_and_not_reused() {
    let mut o = Observed::new(reusable(tether_spec()), pooled());
    let s = o.d.create_session().await.unwrap();
    let w1 = s.worker().id().to_string();
    s.worker().mark_invalid();
    assert_eq!(echo_round(s, &[b"1"]).await.1, TerminationKind::Finished);
    let s = o.d.create_session().await.unwrap();
    assert_ne!(
        s.worker().id(),
        w1,
        "an invalid worker is not reused (udf §6.6)"
    );
    assert_eq!(echo_round(s, &[b"2"]).await.1, TerminationKind::Finished);
    o.d.close().await;

    let events = o.rx.try_recv_all();
    assert_eq!(
        words_of(&events, &w1),
        [
            "spawned",
            "ready",
            "created",
            "invalidated:Marked",
            "initialized",
            "terminated:Finished",
            "stopped:Invalid",
        ]
    );
    o.invalidated_once("marked");
    assert_eq!(o.metric("tether_udf_workers_spawned_total", &[]), 2.0);
    assert_eq!(o.metric("tether_udf_workers_reused_total", &[]), 0.0);
    assert_eq!(o.gauges(), [0.0; 3]);
}

#[tokio::test]
async fn a_session_dropped_outside_a_runtime_is_interrupted_and_its_worker_invalidated_for_it() {
    let mut o = Observed::new(reusable(tether_spec()), pooled());
    let s = o.d.create_session().await.unwrap();
    let w1 = s.worker().id().to_string();
    let (s, _response) = s.init(init("udf")).await.expect("init");
    // Dropped on a thread without a runtime: no cleanup task can send Cancel and wait for
    // its acknowledgement, so the session is Interrupted at once (udf §4.9, §6.5).
    std::thread::spawn(move || drop(s)).join().unwrap();
    let s = o.d.create_session().await.unwrap();
    assert_ne!(
        s.worker().id(),
        w1,
        "an interrupted session's worker is not reused"
    );
    let _ = s.close().await;
    o.d.close().await;

    let events = o.rx.try_recv_all();
    assert_eq!(
        words_of(&events, &w1),
        [
            "spawned",
            "ready",
            "created",
            "initialized",
            "terminated:Interrupted",
            "invalidated:Interrupted",
            "stopped:Invalid",
        ]
    );
    assert_eq!(
        o.metric(
            "tether_udf_sessions_total",
            &[("termination", "interrupted")]
        ),
        1.0
    );
    o.invalidated_once("interrupted");
    assert_eq!(o.gauges(), [0.0; 3]);
}

#[tokio::test]
async fn a_pooled_worker_that_cannot_open_a_session_is_invalidated_as_open_failed() {
    let mut o = Observed::new(reusable(tether_spec()), pooled());
    let s = o.d.create_session().await.unwrap();
    let w1 = s.worker().id().to_string();
    let address = o.d.worker(&w1).unwrap().address;
    assert_eq!(echo_round(s, &[b"1"]).await.1, TerminationKind::Finished);
    // The idle worker still runs, but its socket is gone: the pool finds it healthy (the
    // framed transport has no channel state to ask, udf §6.6) and the session's connection
    // fails; the dispatcher invalidates it and starts another (udf §6.2 step 6).
    std::fs::remove_file(socket_of(&address)).unwrap();
    let s = o.d.create_session().await.unwrap();
    let w2 = s.worker().id().to_string();
    assert_ne!(w2, w1);
    assert_eq!(echo_round(s, &[b"2"]).await.1, TerminationKind::Finished);
    o.d.close().await;

    let events = o.rx.try_recv_all();
    // Taken from the pool for reuse, then invalidated when its connection failed.
    assert_eq!(
        words_of(&events, &w1),
        after_a_finished_session(&["reused", "invalidated:OpenFailed", "stopped:Invalid"])
    );
    o.invalidated_once("open_failed");
    assert_eq!(o.metric("tether_udf_workers_reused_total", &[]), 1.0);
    assert_eq!(o.metric("tether_udf_workers_spawned_total", &[]), 2.0);
    assert_eq!(o.gauges(), [0.0; 3]);
}

/// The framed transport with a channel state of its own: a switch the test turns off, as a
/// gRPC channel goes inactive when its connection to a still-running worker is lost
/// (udf §3 `WorkerConnection.isActive`).
#[derive(Default)]
struct Switchable {
    framed: FramedTransport,
    active: Arc<AtomicBool>,
}

impl WorkerTransport for Switchable {
    type Channel = Arc<AtomicBool>;
    type Connection = <FramedTransport as WorkerTransport>::Connection;

    fn connect<'a>(
        &'a self,
        address: &'a WorkerAddress,
    ) -> BoxFuture<'a, std::io::Result<Arc<AtomicBool>>> {
        Box::pin(async move {
            self.framed.connect(address).await?;
            Ok(self.active.clone())
        })
    }

    fn open_session<'a>(
        &'a self,
        _channel: &'a Arc<AtomicBool>,
        address: &'a WorkerAddress,
    ) -> BoxFuture<'a, std::io::Result<Self::Connection>> {
        self.framed.open_session(&(), address)
    }

    fn is_active(&self, channel: &Arc<AtomicBool>) -> bool {
        channel.load(Ordering::SeqCst)
    }
}

#[tokio::test]
async fn an_idle_worker_whose_channel_went_inactive_is_invalidated_as_inactive_and_replaced() {
    let transport = Switchable::default();
    let active = transport.active.clone();
    active.store(true, Ordering::SeqCst);
    let mut o = Observed::over(reusable(tether_spec()), transport, pooled(), 1024);
    let s = o.d.create_session().await.unwrap();
    let w1 = s.worker().id().to_string();
    let pid1 = o.d.worker(&w1).unwrap().pid;
    assert_eq!(echo_round(s, &[b"1"]).await.1, TerminationKind::Finished);
    assert_eq!(o.gauges(), [0.0, 1.0, 1.0], "idle in the pool");
    // The process still runs; only its channel is gone. The pool judges it before reuse
    // (udf §6.6: alive, valid and active), invalidates it and starts another.
    active.store(false, Ordering::SeqCst);
    let s = o.d.create_session().await.unwrap();
    let w2 = s.worker().id().to_string();
    assert_ne!(w2, w1, "an inactive worker is not reused (udf §6.6)");
    active.store(true, Ordering::SeqCst);
    assert_eq!(echo_round(s, &[b"2"]).await.1, TerminationKind::Finished);
    eventually("the inactive worker is stopped", || !exists(pid1)).await;
    o.d.close().await;

    let events = o.rx.try_recv_all();
    assert_eq!(
        words_of(&events, &w1),
        after_a_finished_session(&["invalidated:Inactive", "stopped:Invalid"])
    );
    o.invalidated_once("inactive");
    assert_eq!(o.metric("tether_udf_workers_reused_total", &[]), 0.0);
    assert_eq!(o.metric("tether_udf_workers_spawned_total", &[]), 2.0);
    assert_eq!(
        o.metric("tether_udf_workers_stopped_total", &[("reason", "invalid")]),
        1.0
    );
    assert_eq!(o.gauges(), [0.0; 3]);
}

#[tokio::test]
async fn an_idle_worker_past_its_timeout_is_stopped_for_it_and_leaves_the_pool() {
    let pool = DispatcherConfig {
        pool: Some(PoolConfig {
            max_idle: 4,
            idle_timeout: Duration::from_millis(100),
        }),
        ..config()
    };
    let mut o = Observed::new(reusable(tether_spec()), pool);
    let s = o.d.create_session().await.unwrap();
    let w = s.worker().id().to_string();
    assert_eq!(echo_round(s, &[b"1"]).await.1, TerminationKind::Finished);
    assert_eq!(o.gauges(), [0.0, 1.0, 1.0]);
    eventually("the idle worker is stopped", || o.d.workers().is_empty()).await;
    o.d.settle().await;
    assert_eq!(o.gauges(), [0.0; 3], "out of the pool, stopped");
    o.d.close().await;
    let events = o.rx.try_recv_all();
    assert_eq!(
        of_worker(&events, &w)
            .into_iter()
            .map(word)
            .collect::<Vec<_>>(),
        after_a_finished_session(&["stopped:IdleTimeout"])
    );
    assert_eq!(
        o.metric(
            "tether_udf_workers_stopped_total",
            &[("reason", "idle_timeout")]
        ),
        1.0
    );
    assert_eq!(o.metric("tether_udf_workers_stopped_total", &[]), 1.0);
}

#[tokio::test]
async fn a_worker_exiting_at_start_is_spawned_and_stopped_never_ready() {
    let runner = ProcessCallable {
        command: ["bash", "-c", "exit 3"].map(String::from).to_vec(),
        ..Default::default()
    };
    let mut o = Observed::new(direct_worker_spec(runner, false), config());
    let e =
        o.d.create_session()
            .await
            .expect_err("the worker exits at once");
    assert!(matches!(e, DispatchError::ExitedAtStart { .. }), "{e}");
    o.d.close().await;
    let events = o.rx.try_recv_all();
    assert_eq!(words(&events), ["spawned", "stopped:StartFailed"]);
    assert_eq!(o.metric("tether_udf_workers_spawned_total", &[]), 1.0);
    assert_eq!(
        o.metric(
            "tether_udf_workers_stopped_total",
            &[("reason", "start_failed")]
        ),
        1.0
    );
    assert_eq!(o.metric("tether_udf_worker_startup_seconds", &[]), 0.0);
    assert_eq!(o.metric("tether_udf_sessions_total", &[]), 0.0);
    assert_eq!(o.gauges(), [0.0; 3]);
}

/// The dispatcher's close stops the workers of running sessions (udf §6.2 `close`): their
/// sessions end `TransportFailed` with a `WorkerLost` that names the stop, and no worker is
/// judged (no `WorkerInvalidated`, nothing in `tether_udf_workers_invalidated_total`): the
/// dispatcher decided their end, not a fault of theirs.
#[tokio::test]
async fn closing_the_dispatcher_under_running_sessions_judges_no_worker() {
    let mut o = Observed::new(tether_spec(), config());
    let mut running = Vec::new();
    for _ in 0..2 {
        let s = o.d.create_session().await.unwrap();
        let (mut s, _) = s.init(init("udf")).await.expect("init");
        s.send(Bytes::from_static(b"1")).await.expect("send");
        assert_eq!(
            s.recv().await.expect("echo"),
            Some(Bytes::from_static(b"1"))
        );
        running.push(s);
    }
    o.d.close().await;
    let mut workers = Vec::new();
    for mut s in running {
        let err = recv_error(&mut s, "a stopped worker cannot finish the session").await;
        let lost = worker_lost(&err);
        assert_eq!(lost.stopping, Some(StopReason::DispatcherClosed), "{lost}");
        assert!(
            lost.output.is_empty(),
            "no output quoted for a stop: {lost}"
        );
        assert!(
            lost.to_string()
                .contains("stopped by the dispatcher: closed"),
            "{lost}"
        );
        workers.push(s.worker().id().to_owned());
        assert_eq!(s.close().await.kind(), TerminationKind::TransportFailed);
    }
    let events = o.rx.try_recv_all();
    for w in &workers {
        let words = words_of(&events, w);
        assert!(
            !words.iter().any(|w| w.starts_with("invalidated")),
            "{words:?}"
        );
        assert!(
            words.contains(&"stopped:DispatcherClosed".to_owned()),
            "{words:?}"
        );
        assert!(
            words.contains(&"terminated:TransportFailed".to_owned()),
            "{words:?}"
        );
    }
    assert_eq!(o.metric("tether_udf_workers_invalidated_total", &[]), 0.0);
    assert_eq!(
        o.metric("tether_udf_workers_stopped_total", &[("reason", "closed")]),
        2.0
    );
    assert_eq!(
        o.metric(
            "tether_udf_sessions_total",
            &[("termination", "transport_failed")]
        ),
        2.0
    );
    assert_eq!(o.gauges(), [0.0; 3]);
}

// ---------------------------------------------------------------------------------------
// A full channel.

#[tokio::test]
async fn a_full_channel_drops_and_counts_while_the_metrics_stay_complete() {
    let mut o = Observed::with_capacity(tether_spec(), config(), 2);
    let s = o.d.create_session().await.unwrap();
    assert_eq!(echo_round(s, &[b"a"]).await.1, TerminationKind::Finished);
    o.d.close().await;
    // Six events (spawned, ready, created, initialized, terminated, stopped): the first two
    // fit, the other four are dropped and counted on both sides.
    assert_eq!(words(&o.rx.try_recv_all()), ["spawned", "ready"]);
    assert_eq!(o.rx.dropped(), 4);
    assert_eq!(
        o.metric("tether_events_dropped_total", &[("side", "udf")]),
        4.0
    );
    assert_eq!(
        o.metric("tether_udf_sessions_total", &[("termination", "finished")]),
        1.0
    );
    assert_eq!(o.metric("tether_udf_workers_stopped_total", &[]), 1.0);
}

// ---------------------------------------------------------------------------------------
// A session without a dispatcher.

#[tokio::test]
async fn a_bare_session_reports_its_states_in_order_and_no_metrics() {
    let recorder = Arc::new(MetricTotals::default());
    let metrics = recorder.clone();
    let clock = ManualClock::new();
    let (tx, mut rx) = event_channel(16);
    let config = SessionConfig {
        events: Some(tx),
        ..session_config_on(&clock)
    };
    let (engine, worker) = pair::<UdfRequest, UdfResponse>(8);
    let worker = tokio::spawn(serve(worker, EchoUdf::default(), echo_config()));
    let handle = Arc::new(CountingHandle::for_one_session());
    let session = metrics::with_local_recorder(&*recorder, || {
        Session::new(engine, Arc::clone(&handle), config)
    });
    let id = session.id();
    assert_eq!(
        words(&rx.try_recv_all()),
        ["created"],
        "reported at construction"
    );
    clock.advance(Duration::from_secs(1));
    let (session, _) = session.init(init("udf")).await.unwrap();
    let mut output = session.process(futures::stream::iter([Bytes::from_static(b"x")]));
    assert_eq!(
        output.next().await.unwrap().unwrap(),
        Bytes::from_static(b"x")
    );
    assert!(output.next().await.is_none());
    // The stream saw the terminator: reported before close.
    let events = rx.try_recv_all();
    assert_eq!(words(&events), ["initialized", "terminated:Finished"]);
    assert_eq!(output.close().await.kind(), TerminationKind::Finished);
    assert!(rx.try_recv_all().is_empty(), "a session terminates once");
    let _ = worker.await;
    for e in &events {
        assert_eq!((&*e.worker, e.session), (handle.id(), Some(id)));
        assert_eq!(e.at, clock.now(), "stamped on the session's clock");
    }
    assert_eq!(metrics.get("tether_udf_sessions_total", &[]), 0.0);
    assert_eq!(metrics.get("tether_udf_sessions", &[]), 0.0);
}
