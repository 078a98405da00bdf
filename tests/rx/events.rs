//! Lifecycle events and metrics of the execution manager (`tether::observe`): the ported
//! `ExecuteEventsManagerSuite` scenarios (rx §7.4, `rx_s39`–`rx_s45`), the events of every
//! lifecycle path (finish, failure, interrupt, release, abandonment, tombstones, reattach,
//! rotation), a full channel that drops and counts, and the metrics equal to the events.
//! [`EventLaw`] is the checker the server model (`server_model`) runs over random RPC
//! sequences.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tether::execution::{
    ConnectError, ExecutionEvent, ExecutionEventKind as K, ExecutionManager, ManagerConfig,
    OperationStatus, RotationReason, StreamLimits,
};
use tether::observe::{EventReceiver, event_channel};
use tether::time::ManualClock;
use tether::wire::connect::InterruptType;
use tether_testing::connect::{self, Caller, ManualManager};
use tether_testing::metrics::MetricTotals;
use uuid::Uuid;

// ---------------------------------------------------------------------------------------------
// The checker and the metrics reader
// ---------------------------------------------------------------------------------------------

/// The status an operation event moves to, `None` for tether's own events.
pub(crate) fn status_of(kind: &K) -> Option<OperationStatus> {
    Some(match kind {
        K::OperationStarted { .. } => OperationStatus::Started,
        K::OperationAnalyzed { .. } => OperationStatus::Analyzed,
        K::OperationReadyForExecution => OperationStatus::ReadyForExecution,
        K::OperationFinished { .. } => OperationStatus::Finished,
        K::OperationFailed { .. } => OperationStatus::Failed,
        K::OperationCanceled => OperationStatus::Canceled,
        K::OperationClosed => OperationStatus::Closed,
        _ => return None,
    })
}

/// Checks an event stream against Spark's status machine (rx §2.1 item 4): per operation,
/// every status event is allowed from the one before (a new execution of a closed id
/// starts again from `Pending`), tether's own events only while the operation is open;
/// per session, Started and Closed alternate, and no operation event of a closed session
/// follows its `SessionClosed`.
#[derive(Debug, Default)]
pub(crate) struct EventLaw {
    ops: HashMap<Uuid, OperationStatus>,
    sessions: HashMap<Uuid, bool>,
    /// Operation events seen, by kind name (for the metric equalities).
    pub(crate) started: u64,
    pub(crate) closed: u64,
    pub(crate) seen: u64,
}

impl EventLaw {
    pub(crate) fn check(&mut self, e: &ExecutionEvent) {
        self.seen += 1;
        let Some(op) = e.operation_id else {
            let live = self.sessions.entry(e.session_id).or_insert(false);
            match e.kind {
                K::SessionStarted { .. } => assert!(!*live, "SessionStarted twice: {e:?}"),
                K::SessionClosed { .. } => {
                    assert!(*live, "SessionClosed of no live session: {e:?}")
                }
                _ => panic!("an event without an operation that is no session event: {e:?}"),
            }
            *live = matches!(e.kind, K::SessionStarted { .. });
            return;
        };
        if !matches!(e.kind, K::TombstoneHit) {
            assert_eq!(
                self.sessions.get(&e.session_id),
                Some(&true),
                "an operation event outside a live session: {e:?}"
            );
        }
        let status = self.ops.entry(op).or_insert(OperationStatus::Pending);
        match status_of(&e.kind) {
            Some(next) => {
                let from = if *status == OperationStatus::Closed {
                    OperationStatus::Pending
                } else {
                    *status
                };
                assert!(
                    from.allows(next),
                    "rx §2.1: {next:?} after {from:?} is not a legal event ({e:?})"
                );
                *status = next;
                self.started += u64::from(next == OperationStatus::Started);
                self.closed += u64::from(next == OperationStatus::Closed);
            }
            None if matches!(e.kind, K::TombstoneHit) => {}
            None => assert!(
                !matches!(*status, OperationStatus::Pending | OperationStatus::Closed),
                "tether's event outside the operation's life: {e:?}"
            ),
        }
    }

    /// Operations registered and not yet closed.
    pub(crate) fn open(&self) -> usize {
        self.ops
            .values()
            .filter(|s| !matches!(s, OperationStatus::Pending | OperationStatus::Closed))
            .count()
    }

    /// Live sessions.
    pub(crate) fn live_sessions(&self) -> usize {
        self.sessions.values().filter(|l| **l).count()
    }
}

/// A manager on a manual clock, with a test listener and a recorder of its own.
pub(crate) struct Observed {
    pub(crate) clock: ManualClock,
    pub(crate) m: ExecutionManager,
    pub(crate) rx: EventReceiver<ExecutionEvent>,
    pub(crate) metrics: Arc<MetricTotals>,
}

impl Observed {
    pub(crate) fn new(config: ManagerConfig, capacity: usize) -> Self {
        let recorder = Arc::new(MetricTotals::default());
        let metrics = recorder.clone();
        let (tx, rx) = event_channel(capacity);
        let ManualManager { clock, manager } = metrics::with_local_recorder(&*recorder, || {
            ManualManager::new(ManagerConfig {
                events: Some(tx),
                ..config
            })
        });
        Self {
            clock,
            m: manager,
            rx,
            metrics,
        }
    }

    /// The kinds received so far, each checked by a fresh [`EventLaw`] run over everything.
    fn kinds(&mut self, law: &mut EventLaw) -> Vec<K> {
        self.rx
            .try_recv_all()
            .into_iter()
            .map(|e| {
                law.check(&e);
                e.kind
            })
            .collect()
    }

    /// A metric as a scrape would read it after the manager published its counters (they
    /// are handed to the recorder at each maintenance pass, or on demand).
    pub(crate) fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.m.publish_metrics();
        self.metrics.get(name, labels)
    }
}

fn observed() -> Observed {
    Observed::new(ManagerConfig::default(), 1024)
}

/// The default caller's user id, which `SessionStarted`, `SessionClosed` and
/// `OperationStarted` carry.
fn user() -> Arc<str> {
    Caller::default().session_key().user_id
}

fn started() -> K {
    K::OperationStarted {
        user_id: user(),
        tags: Vec::new(),
        correlation: Default::default(),
    }
}

fn session_started() -> K {
    K::SessionStarted { user_id: user() }
}

fn session_closed() -> K {
    K::SessionClosed { user_id: user() }
}

// ---------------------------------------------------------------------------------------------
// rx §7.4: ExecuteEventsManagerSuite
// ---------------------------------------------------------------------------------------------

#[test]
fn rx_s39_registration_posts_started_with_the_ids_and_the_job_tag() {
    let mut o = observed();
    let c = Caller::default();
    let op = connect::op_id();
    let (_p, _s) = connect::start(&o.m, &c.execute(&op));
    let events = o.rx.try_recv_all();
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0].kind, session_started());
    let e = &events[1];
    assert_eq!(e.kind, started());
    assert_eq!(e.session_id, c.session_key().session_id);
    assert_eq!(e.user_id(), Some(&*c.session_key().user_id));
    assert_eq!(e.operation_id.map(|u| u.to_string()), Some(op.clone()));
    assert_eq!(
        e.job_tag(&c.session_key().user_id).unwrap(),
        format!(
            "SparkConnect_OperationTag_User_{}_Session_{}_Operation_{op}",
            c.session_key().user_id,
            c.session_key().session_id
        )
    );
}

#[test]
fn rx_s40_each_transition_posts_exactly_one_event() {
    let mut law = EventLaw::default();
    // Started → Analyzed (with and without text) → ReadyForExecution → Finished (rows) →
    // Closed.
    let mut o = observed();
    let c = Caller::default();
    let op = connect::op_id();
    let (mut p, mut s) = connect::start(&o.m, &c.execute(&op));
    p.analyzed(None).unwrap();
    p.analyzed(Some("range(3)".into())).unwrap();
    p.ready_for_execution().unwrap();
    connect::push_n(&mut p, 1, 3);
    p.finish().unwrap();
    let _ = connect::drain(&mut s);
    o.m.release_execute(&c.release_all(&op)).unwrap();
    assert_eq!(
        o.kinds(&mut law),
        [
            session_started(),
            started(),
            K::OperationAnalyzed {
                statement_text: None
            },
            K::OperationAnalyzed {
                statement_text: Some("range(3)".into())
            },
            K::OperationReadyForExecution,
            K::OperationFinished {
                produced_row_count: Some(6)
            },
            K::Released { until: None },
            K::OperationClosed,
        ]
    );
    // Started → Finished without rows; Started → Canceled; Started → Failed.
    let (p, _s) = connect::start(&o.m, &c.execute(&connect::op_id()));
    p.finish().unwrap();
    let (_p, _s2) = connect::start(&o.m, &c.execute(&connect::op_id()));
    let interrupted = connect::op_id();
    let (_p3, _s3) = connect::start(&o.m, &c.execute(&interrupted));
    o.m.interrupt(&c.interrupt_op(&interrupted)).unwrap();
    let (p4, _s4) = connect::start(&o.m, &c.execute(&connect::op_id()));
    p4.fail(ConnectError::OperationCanceled).unwrap();
    let kinds = o.kinds(&mut law);
    assert_eq!(
        kinds,
        [
            started(),
            K::OperationFinished {
                produced_row_count: None
            },
            started(),
            started(),
            K::OperationCanceled,
            started(),
            K::OperationFailed {
                error_message: ConnectError::OperationCanceled.to_string()
            },
        ]
    );
}

#[test]
fn rx_s41_to_s44_the_status_machine_refuses_what_spark_refuses() {
    use OperationStatus::*;
    let all = [
        Pending,
        Started,
        Analyzed,
        ReadyForExecution,
        Finished,
        Failed,
        Canceled,
        Closed,
    ];
    let refused = |from: OperationStatus| -> Vec<OperationStatus> {
        all.iter().copied().filter(|to| !from.allows(*to)).collect()
    };
    // s41: nothing after Closed.
    assert_eq!(refused(Closed), all);
    // s42: from Finished, started/analyzed/ready/finished (and Pending, never posted).
    assert_eq!(
        refused(Finished),
        [Pending, Started, Analyzed, ReadyForExecution, Finished]
    );
    // s43: from Canceled, all but Closed.
    assert_eq!(
        refused(Canceled),
        [
            Pending,
            Started,
            Analyzed,
            ReadyForExecution,
            Finished,
            Failed,
            Canceled
        ]
    );
    // s44: from ReadyForExecution started/analyzed/ready/closed; from Analyzed
    // started/finished/closed; from Started started/ready/closed.
    assert_eq!(
        refused(ReadyForExecution),
        [Pending, Started, Analyzed, ReadyForExecution, Closed]
    );
    assert_eq!(refused(Analyzed), [Pending, Started, Finished, Closed]);
    assert_eq!(
        refused(Started),
        [Pending, Started, ReadyForExecution, Closed]
    );
    // Through a producer: readiness before analysis, analysis after the end.
    let o = observed();
    let (p, _s) = connect::start(&o.m, &connect::execute(&connect::op_id()));
    let e = p.ready_for_execution().unwrap_err();
    assert_eq!((e.from, e.to), (Started, ReadyForExecution));
    let op = connect::op_id();
    let (p, _s) = connect::start(&o.m, &connect::execute(&op));
    o.m.interrupt(&connect::interrupt_op(&op)).unwrap();
    assert_eq!(p.analyzed(None).unwrap_err().from, Canceled);
}

#[test]
fn rx_s45_no_operation_event_follows_its_session_closed() {
    let mut law = EventLaw::default();
    let mut o = observed();
    let c = Caller::default();
    let (_p, _s) = connect::start(&o.m, &c.execute(&connect::op_id()));
    let (_p2, _s2) = connect::start(&o.m, &c.execute(&connect::op_id()));
    o.m.release_session(&c.release_session(false));
    let kinds = o.kinds(&mut law);
    // Both running executions are canceled, abandoned and closed before the session.
    assert_eq!(kinds.last(), Some(&session_closed()));
    assert_eq!(
        kinds.iter().filter(|k| **k == K::OperationClosed).count(),
        2
    );
    assert_eq!(kinds.iter().filter(|k| **k == K::Abandoned).count(), 2);
    assert_eq!(law.open(), 0);
    assert_eq!(law.live_sessions(), 0);
}

// ---------------------------------------------------------------------------------------------
// tether's own events
// ---------------------------------------------------------------------------------------------

#[test]
fn a_reattach_reports_its_position_and_what_it_replays_then_a_rotation() {
    let mut law = EventLaw::default();
    let mut o = Observed::new(
        ManagerConfig {
            stream: StreamLimits {
                max_duration: Some(Duration::from_secs(10)),
                max_bytes: None,
            },
            ..ManagerConfig::default()
        },
        1024,
    );
    let c = Caller::default();
    let op = connect::op_id();
    let (mut p, mut s) = connect::start(&o.m, &c.execute(&op));
    connect::push_n(&mut p, 1, 3);
    let first = connect::next(&mut s);
    let _ = connect::next(&mut s);
    let _ = connect::next(&mut s);
    drop(s);
    o.clock.advance(Duration::from_secs(2));
    // Resume after the first: the second and third are sent again.
    let first_id = first.response_id.clone();
    let mut s =
        o.m.reattach_execute(&c.reattach(&op, Some(&first_id)))
            .unwrap();
    o.clock.advance(Duration::from_secs(10));
    let _ = connect::drain(&mut s);
    let kinds = o.kinds(&mut law);
    assert_eq!(
        &kinds[2..],
        [
            // Resumed after the first: the second and third again.
            K::Reattached {
                resumed_at: 2,
                replayed: 2
            },
            K::StreamRotated {
                reason: RotationReason::Duration
            },
        ]
    );
    assert_eq!(o.metric("tether_connect_reattaches_total", &[]), 1.0);
    assert_eq!(
        o.metric("tether_connect_replayed_responses_total", &[]),
        2.0
    );
    assert_eq!(
        o.metric(
            "tether_connect_stream_rotations_total",
            &[("reason", "duration")]
        ),
        1.0
    );
    // The gap the execution spent detached: one sample.
    assert_eq!(o.metric("tether_connect_reattach_gap_seconds", &[]), 1.0);
    // The gauges are sampled by the maintenance pass.
    o.m.maintain();
    assert_eq!(o.metric("tether_connect_attached_streams", &[]), 0.0);
    assert_eq!(o.metric("tether_connect_executions", &[]), 1.0);
    p.finish().unwrap();
}

#[test]
fn abandonment_then_a_tombstone_hit() {
    let mut law = EventLaw::default();
    let mut o = observed();
    let c = Caller::default();
    let op = connect::op_id();
    let (p, s) = connect::start(&o.m, &c.execute(&op));
    p.finish().unwrap();
    drop(s);
    o.clock.advance(Duration::from_secs(6 * 60));
    o.m.maintain();
    let e = o.m.reattach_execute(&c.reattach(&op, None)).unwrap_err();
    assert_eq!(e.condition(), Some("INVALID_HANDLE.OPERATION_ABANDONED"));
    let kinds = o.kinds(&mut law);
    assert_eq!(
        &kinds[3..],
        [K::Abandoned, K::OperationClosed, K::TombstoneHit]
    );
    assert_eq!(
        o.metric(
            "tether_connect_executions_closed_total",
            &[("removal", "abandoned")]
        ),
        1.0
    );
    assert_eq!(o.metric("tether_connect_tombstone_hits_total", &[]), 1.0);
    assert_eq!(
        o.metric(
            "tether_connect_errors_total",
            &[("condition", "INVALID_HANDLE.OPERATION_ABANDONED")]
        ),
        1.0
    );
}

/// Every error answered to a client is counted once in `tether_connect_errors_total` (rx
/// §1.8), by its condition: one refusal by each RPC handler, and one error on a response
/// stream.
#[test]
fn each_error_answered_is_counted_once_by_rpc_or_by_stream() {
    let o = observed();
    let c = Caller::default();
    let no_uuid = Caller::new("alice", "not-a-uuid");
    let op = connect::op_id();
    let mut answered = vec![
        o.m.execute_plan(&no_uuid.execute(&op)).unwrap_err(),
        o.m.reattach_execute(&c.reattach(&op, None)).unwrap_err(),
        o.m.get_or_create_session("alice", "not-a-uuid", None)
            .unwrap_err(),
        o.m.interrupt(&c.interrupt(InterruptType::Tag, None))
            .unwrap_err(),
    ];
    let (_p, mut s) = connect::start(&o.m, &c.execute_with(&op, false));
    answered.push(o.m.release_execute(&c.release_all(&op)).unwrap_err());
    o.m.interrupt(&c.interrupt_op(&op)).unwrap();
    answered.push(connect::expect_err(&mut s));

    let mut want: HashMap<&str, f64> = HashMap::new();
    for e in &answered {
        *want.entry(e.condition().unwrap_or("OTHER")).or_default() += 1.0;
    }
    for (condition, n) in want {
        assert_eq!(
            o.metric("tether_connect_errors_total", &[("condition", condition)]),
            n,
            "{condition}"
        );
    }
    assert_eq!(o.metric("tether_connect_errors_total", &[]), 6.0);
}

#[test]
fn release_until_is_reported_and_counted() {
    let mut o = observed();
    let c = Caller::default();
    let op = connect::op_id();
    let (mut p, mut s) = connect::start(&o.m, &c.execute(&op));
    connect::push_n(&mut p, 1, 2);
    let r = connect::next(&mut s);
    o.m.release_execute(&c.release_until(&op, &r.response_id))
        .unwrap();
    let kinds: Vec<_> = o.rx.try_recv_all().into_iter().map(|e| e.kind).collect();
    assert_eq!(kinds.last(), Some(&K::Released { until: Some(1) }));
    assert_eq!(
        o.metric("tether_connect_releases_total", &[("kind", "until")]),
        1.0
    );
    p.finish().unwrap();
}

#[test]
fn a_full_channel_drops_counts_and_never_blocks() {
    let mut o = Observed::new(ManagerConfig::default(), 2);
    let c = Caller::default();
    for _ in 0..3 {
        let (p, _s) = connect::start(&o.m, &c.execute(&connect::op_id()));
        p.finish().unwrap();
    }
    // SessionStarted, Started, Finished × 3: 7 events into 2 slots.
    assert_eq!(o.rx.try_recv_all().len(), 2);
    assert_eq!(o.rx.dropped(), 5);
    assert_eq!(o.metric("tether_events_dropped_total", &[]), 5.0);
    // The metrics saw everything.
    assert_eq!(
        o.metric("tether_connect_executions_started_total", &[]),
        3.0
    );
    assert_eq!(
        o.metric(
            "tether_connect_executions_ended_total",
            &[("status", "finished")]
        ),
        3.0
    );
}

#[test]
fn metrics_without_a_listener_and_sampled_gauges_back_to_zero() {
    let recorder = Arc::new(MetricTotals::default());
    let totals = recorder.clone();
    let metric = |name: &str, labels: &[(&str, &str)]| totals.get(name, labels);
    let ManualManager { manager: m, .. } =
        metrics::with_local_recorder(&*recorder, || ManualManager::new(ManagerConfig::default()));
    let c = Caller::default();
    let ops: Vec<String> = (0..4).map(|_| connect::op_id()).collect();
    let mut streams = Vec::new();
    for op in &ops {
        let (mut p, s) = connect::start(&m, &c.execute(op));
        connect::push_n(&mut p, 1, 2);
        p.finish().unwrap();
        streams.push(s);
    }
    // The gauges are sampled by the maintenance pass.
    assert_eq!(metric("tether_connect_executions", &[]), 0.0);
    m.maintain();
    assert_eq!(metric("tether_connect_executions", &[]), 4.0);
    assert_eq!(metric("tether_connect_attached_streams", &[]), 4.0);
    assert_eq!(metric("tether_connect_sessions", &[]), 1.0);
    drop(streams);
    m.maintain();
    assert_eq!(metric("tether_connect_attached_streams", &[]), 0.0);
    m.release_execute(&c.release_all(&ops[0])).unwrap();
    m.release_session(&c.release_session(false));
    m.maintain();
    for gauge in [
        "tether_connect_executions",
        "tether_connect_sessions",
        "tether_connect_attached_streams",
    ] {
        assert_eq!(metric(gauge, &[]), 0.0, "{gauge}");
    }
    let stats = m.stats();
    assert_eq!(
        metric("tether_connect_executions_started_total", &[]),
        stats.created as f64
    );
    assert_eq!(
        metric(
            "tether_connect_executions_closed_total",
            &[("removal", "released")]
        ),
        stats.released as f64
    );
    assert_eq!(
        metric(
            "tether_connect_executions_closed_total",
            &[("removal", "abandoned")]
        ),
        stats.abandoned as f64
    );
    assert_eq!(metric("tether_connect_sessions_closed_total", &[]), 1.0);
}

#[test]
fn the_metrics_of_two_managers_in_one_process_add_up() {
    let recorder = Arc::new(MetricTotals::default());
    let build = || {
        metrics::with_local_recorder(&*recorder, || {
            ManualManager::new(ManagerConfig::default()).manager
        })
    };
    let (one, two) = (build(), build());
    let c = Caller::default();
    let mut keep = Vec::new();
    for _ in 0..3 {
        keep.push(connect::start(&one, &c.execute(&connect::op_id())));
    }
    keep.push(connect::start(&two, &c.execute(&connect::op_id())));
    // Published twice each, in either order: counters add the increase since the last
    // publication, gauges the change since the last sample.
    for m in [&one, &two, &one, &two] {
        m.publish_metrics();
    }
    assert_eq!(
        recorder.get("tether_connect_executions_started_total", &[]),
        4.0
    );
    assert_eq!(recorder.get("tether_connect_executions", &[]), 4.0);
    assert_eq!(recorder.get("tether_connect_attached_streams", &[]), 4.0);
    assert_eq!(recorder.get("tether_connect_sessions", &[]), 2.0);
    drop(keep);
    two.release_session(&c.release_session(false));
    two.publish_metrics();
    assert_eq!(recorder.get("tether_connect_executions", &[]), 3.0);
    assert_eq!(recorder.get("tether_connect_sessions", &[]), 1.0);
    assert_eq!(
        recorder.get(
            "tether_connect_executions_closed_total",
            &[("removal", "abandoned")]
        ),
        1.0
    );
}
