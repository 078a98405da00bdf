//! The manager-wide memory budget (tether's own bound over every execution's unsent and
//! retained responses, rx §3.1, §3.4): exact accounting, the per-execution floor, FIFO
//! waiting, and a run of 1 000 executions whose consumers stall.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use proptest::prelude::*;
use tether::execution::{
    ExecutionManager, LogConfig, ManagerConfig, MemoryBudget, ProduceError, PushError, ResponseLog,
    Stamp,
};
use tether::wire::connect::ExecutePlanResponse;
use tether_testing::connect::{self, Caller};

const LOGS: usize = 4;
const LIMIT: u64 = 1_500;
const LENS: [usize; 3] = [10, 200, 700];

fn stamp() -> Stamp {
    let id: Arc<str> = Arc::from("00000000-0000-4000-8000-000000000000");
    Stamp {
        session_id: id.clone(),
        server_side_session_id: id.clone(),
        operation_id: id,
    }
}

fn new_log(budget: &Arc<MemoryBudget>, retry_budget: u64) -> ResponseLog {
    ResponseLog::new(
        LogConfig {
            retry_budget,
            max_unsent_bytes: 2_000,
            max_unsent_responses: 6,
        },
        stamp(),
    )
    .with_budget(budget.clone())
}

#[derive(Debug, Clone)]
enum Op {
    Push(usize, usize),
    Consume(usize),
    ReleaseUntilConsumed(usize),
    Finish(usize),
    Fail(usize),
    Clear(usize),
    Drop(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let log = 0..LOGS;
    prop_oneof![
        4 => (log.clone(), 0..LENS.len()).prop_map(|(l, n)| Op::Push(l, n)),
        4 => log.clone().prop_map(Op::Consume),
        1 => log.clone().prop_map(Op::ReleaseUntilConsumed),
        1 => log.clone().prop_map(Op::Finish),
        1 => log.clone().prop_map(Op::Fail),
        1 => log.clone().prop_map(Op::Clear),
        1 => log.prop_map(Op::Drop),
    ]
}

struct World {
    budget: Arc<MemoryBudget>,
    logs: Vec<ResponseLog>,
    /// The next index each log's consumer asks for.
    next: Vec<u64>,
    retry_budgets: Vec<u64>,
}

impl World {
    fn new(retry_budgets: Vec<u64>) -> Self {
        let budget = MemoryBudget::new(LIMIT);
        Self {
            logs: retry_budgets.iter().map(|&r| new_log(&budget, r)).collect(),
            next: vec![1; LOGS],
            budget,
            retry_budgets,
        }
    }

    fn largest(&self) -> u64 {
        let r = connect::batch_of_len(1, LENS[LENS.len() - 1]);
        self.logs[0].stamped_len(&r)
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Push(l, n) => {
                let log = &mut self.logs[l];
                let response = connect::batch_of_len(l as i64 + 1, LENS[n]);
                let size = log.stamped_len(&response);
                let held_before = log.held_bytes();
                let per_exec_blocks = log.would_block(size);
                match log.push(response.clone()) {
                    Ok(_) => {}
                    Err(PushError::WouldBlock(back)) => {
                        assert!(per_exec_blocks);
                        assert_eq!(back.response_type, response.response_type, "kept");
                    }
                    Err(PushError::BudgetFull(back)) => {
                        // The floor: a log that holds nothing is always admitted, and one
                        // with nothing unsent evicts its retry buffer rather than wait.
                        assert!(held_before > 0 && log.unsent_len() > 0, "floor violated");
                        assert_eq!(back.response_type, response.response_type, "kept");
                        assert!(back.response_id.is_empty());
                    }
                    Err(PushError::Finished(_)) => assert!(log.is_finished()),
                }
            }
            Op::Consume(l) => {
                if let Ok(tether::execution::Consumed::Response(..)) =
                    self.logs[l].consume(self.next[l])
                {
                    self.next[l] += 1;
                }
            }
            Op::ReleaseUntilConsumed(l) => {
                let log = &mut self.logs[l];
                if let Some(id) = log.id_at(log.highest_consumed()) {
                    log.release_until(&id.to_string()).expect("a consumed id");
                }
            }
            Op::Finish(l) => {
                let _ = self.logs[l].finish(true);
            }
            Op::Fail(l) => {
                let _ = self.logs[l].fail(tether::execution::ConnectError::OperationCanceled);
            }
            Op::Clear(l) => self.logs[l].clear(),
            Op::Drop(l) => {
                self.logs[l] = new_log(&self.budget, self.retry_budgets[l]);
                self.next[l] = 1;
            }
        }
    }

    fn check(&self) {
        let held: u64 = self.logs.iter().map(ResponseLog::held_bytes).sum();
        let usage = self.budget.usage();
        assert_eq!(
            usage.used, held,
            "the budget's counter drifted from the logs"
        );
        assert!(
            usage.used <= self.budget.bound(LOGS as u64, self.largest()),
            "{usage:?} over the stated bound"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// After any sequence of pushes, consumes, releases (automatic, `ReleaseUntil`,
    /// eviction under pressure), finishes, failures, clears and drops, the budget's counter
    /// is exactly the sum of the logs' held bytes, stays within `limit + n × (largest +
    /// ResultComplete)`, and is 0 once every log is gone.
    #[test]
    fn budget_counts_exactly_the_held_bytes(
        retry in proptest::collection::vec(prop_oneof![Just(0u64), Just(300), Just(10_000)], LOGS),
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        let mut w = World::new(retry);
        for op in &ops {
            w.apply(op);
            w.check();
        }
        let budget = w.budget.clone();
        drop(w);
        prop_assert_eq!(budget.used(), 0);
    }
}

/// The floor: with the budget used up by one log, another log that holds nothing still
/// takes a response, and a log whose consumer caught up evicts its retry buffer to take one.
#[test]
fn floor_and_eviction_keep_every_log_moving() {
    let budget = MemoryBudget::new(1_000);
    let mut hog = new_log(&budget, 10_000);
    let mut other = new_log(&budget, 10_000);
    let big = connect::batch_of_len(1, 600);
    hog.push(big.clone()).unwrap();
    assert!(matches!(
        hog.push(big.clone()),
        Err(PushError::BudgetFull(_))
    ));
    // `other` holds nothing: the floor admits it beyond the limit
    other.push(big.clone()).unwrap();
    assert!(budget.used() > budget.limit());
    assert_eq!(budget.usage().floor_admits, 1);
    // `other`'s consumer reads it: retained under the 10 000-byte retry budget, nothing
    // unsent; the next push evicts the retained response instead of waiting
    assert!(matches!(
        other.consume(1),
        Ok(tether::execution::Consumed::Response(..))
    ));
    assert_eq!(other.unsent_len(), 0);
    assert_eq!(other.retained_len(), 1);
    other.push(big).unwrap();
    assert_eq!(budget.usage().floor_admits, 2);
    assert_eq!(other.retained_len(), 0, "evicted under pressure");
    assert_eq!(other.first_retained(), 2);
    assert_eq!(budget.used(), hog.held_bytes() + other.held_bytes());
    drop((hog, other));
    assert_eq!(budget.used(), 0);
}

fn small_budget_config(limit: u64) -> ManagerConfig {
    ManagerConfig {
        memory_budget: Some(limit),
        max_executions_per_session: 10_000,
        ..ManagerConfig::default()
    }
}

/// Producers past the budget wait in FIFO order and are admitted as bytes are returned:
/// the first to wait is the first admitted.
#[tokio::test]
async fn waiting_producers_are_admitted_in_fifo_order() {
    // Four responses of ~1.1 KiB fit, a fifth does not.
    let m = ExecutionManager::new(small_budget_config(5_000));
    let caller = Caller::new("u", "6f1b7c4e-8a39-4d2c-9e51-0b3a2f7d8c91");
    let mut execs = Vec::new();
    for _ in 0..4 {
        let (mut p, s) = connect::start(&m, &caller.execute(&connect::op_id()));
        p.push(connect::batch_of_len(1, 1_000)).await.unwrap();
        execs.push((p, s));
    }
    assert_eq!(m.memory_usage().unwrap().floor_admits, 0);
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    let mut streams = Vec::new();
    for (i, (mut p, s)) in execs.drain(1..).enumerate() {
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            p.push(connect::batch_of_len(2, 1_000)).await.unwrap();
            order.lock().unwrap().push(i);
            p
        }));
        streams.push(s);
        // let this one queue before the next
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }
    assert_eq!(m.memory_usage().unwrap().waiting, 3);
    assert!(order.lock().unwrap().is_empty());
    // The first execution's consumer reads and releases one response: room for one.
    let (p0, mut s0) = execs.pop().unwrap();
    let first = s0.next().await.unwrap().unwrap();
    m.release_execute(&caller.release_until(s0.operation_id(), &first.response_id))
        .unwrap();
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        *order.lock().unwrap(),
        vec![0],
        "the head of the queue went first"
    );
    assert_eq!(m.memory_usage().unwrap().waiting, 2);
    // Releasing the admitted execution returns its two responses: both others fit.
    m.release_execute(&caller.release_all(streams[0].operation_id()))
        .unwrap();
    for t in tasks {
        drop(
            tokio::time::timeout(Duration::from_secs(5), t)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2]);
    drop((p0, s0, streams));
}

/// `try_push` reports a full budget with the response handed back; nothing is lost.
#[test]
fn try_push_reports_budget_full_and_keeps_the_response() {
    let clock = Arc::new(tether::time::ManualClock::new());
    let m = ExecutionManager::new(ManagerConfig {
        timer: clock,
        ..small_budget_config(1_000)
    });
    let caller = Caller::new("u", "6f1b7c4e-8a39-4d2c-9e51-0b3a2f7d8c91");
    let (mut p, mut s) = connect::start(&m, &caller.execute(&connect::op_id()));
    p.try_push(connect::batch_of_len(1, 900)).unwrap();
    let r = connect::batch_of_len(2, 900);
    let Err(ProduceError::BudgetFull(back)) = p.try_push(r.clone()) else {
        panic!("the budget is full and the log holds an unsent response")
    };
    assert_eq!(back.response_type, r.response_type);
    // the consumer takes the first; nothing unsent: the retry buffer is evicted, admitted
    assert!(matches!(
        s.try_next(),
        tether::execution::ConsumerEvent::Response(_)
    ));
    p.try_push(*back).unwrap();
    match s.try_next() {
        tether::execution::ConsumerEvent::Response(got) => {
            assert_eq!(connect::rows(&got), Some(2));
            assert_eq!(got.response_type, r.response_type);
        }
        other => panic!("{other:?}"),
    }
    drop((p, s));
}

/// Eviction under pressure keeps what a reattach from the last sent response needs (rx §3.5:
/// response ids stay known, and only the next index must be held): that reattach resumes
/// with the next response, while a reattach from an evicted earlier position gets the typed
/// `INVALID_CURSOR.POSITION_NOT_AVAILABLE`, as past Spark's retry budget (rx §3.4).
#[test]
fn eviction_under_pressure_keeps_a_reattach_from_the_last_sent_response() {
    let clock = Arc::new(tether::time::ManualClock::new());
    let m = ExecutionManager::new(ManagerConfig {
        timer: clock,
        ..small_budget_config(1_500)
    });
    let caller = Caller::new("u", "6f1b7c4e-8a39-4d2c-9e51-0b3a2f7d8c91");
    let op = connect::op_id();
    let (mut p, mut s) = connect::start(&m, &caller.execute(&op));
    p.try_push(connect::batch_of_len(1, 500)).unwrap();
    p.try_push(connect::batch_of_len(2, 500)).unwrap();
    let first = connect::next(&mut s);
    let second = connect::next(&mut s);
    // two responses of ~650 bytes fit the 1 500-byte budget, a third does not; nothing is
    // unsent and both are retained (under the 10 MiB retry budget), so the third push
    // evicts them and is taken
    p.try_push(connect::batch_of_len(3, 500)).unwrap();
    let used = m.memory_usage().unwrap().used;
    assert!(
        used < 1_000,
        "the two sent responses were evicted, only the new one is held: {used} bytes"
    );
    drop(s);
    // the client got everything that was sent: it resumes after its last response
    let mut resumed = m
        .reattach_execute(&caller.reattach(&op, Some(&second.response_id)))
        .expect("reattach from the last sent response");
    assert_eq!(connect::rows(&connect::next(&mut resumed)), Some(3));
    drop(resumed);
    // a client that lost the second response in transit cannot have it back: typed error
    let err = match m.reattach_execute(&caller.reattach(&op, Some(&first.response_id))) {
        Ok(mut stream) => connect::expect_err(&mut stream),
        Err(e) => e,
    };
    assert!(
        err.to_string().contains("POSITION_NOT_AVAILABLE"),
        "expected POSITION_NOT_AVAILABLE, got {err}"
    );
    drop(p);
}

/// 1 000 executions whose consumers read one response and then stall: producers wait at
/// the budget (usage ≤ limit + one floor response per execution), and once the consumers
/// drain every execution completes with every response exactly once and in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_stalled_consumers_stay_within_the_budget_and_all_complete() {
    const EXECUTIONS: usize = 1_000;
    const RESPONSES: i64 = 20;
    const PAYLOAD: usize = 1_024;
    const LIMIT: u64 = 256 * 1024;
    let m = ExecutionManager::new(small_budget_config(LIMIT));
    let (drain_tx, drain_rx) = tokio::sync::watch::channel(false);
    let mut producers = Vec::new();
    let mut consumers = Vec::new();
    let mut largest = 0;
    for i in 0..EXECUTIONS {
        // ten sessions of 100 executions each
        let session = format!("6f1b7c4e-8a39-4d2c-9e51-{:012}", i % 10);
        let caller = Caller::new("u", &session);
        let (mut p, mut s) = connect::start(&m, &caller.execute(&connect::op_id()));
        largest = largest.max(p_size(&p, PAYLOAD));
        producers.push(tokio::spawn(async move {
            for seq in 1..=RESPONSES {
                p.push(connect::batch_of_len(seq, PAYLOAD)).await.unwrap();
            }
            p.finish().unwrap();
        }));
        let mut drain = drain_rx.clone();
        consumers.push(tokio::spawn(async move {
            let mut got = Vec::new();
            let first = s.next().await.unwrap().unwrap();
            got.push(first);
            drain.wait_for(|d| *d).await.unwrap();
            while let Some(r) = s.next().await {
                got.push(r.unwrap());
            }
            (caller, got)
        }));
    }
    // Wait until every producer is either done or waiting (the usage stops moving).
    let mut last = None;
    let mut stable = 0;
    while stable < 20 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let u = m.memory_usage().unwrap();
        if Some(u.used) == last {
            stable += 1;
        } else {
            stable = 0;
        }
        last = Some(u.used);
    }
    let budget = m.memory_budget().unwrap().clone();
    let usage = budget.usage();
    let bound = budget.bound(EXECUTIONS as u64, largest);
    let total = EXECUTIONS as u64 * RESPONSES as u64 * largest;
    assert!(usage.used <= bound, "{usage:?} over {bound}");
    assert!(
        usage.used >= LIMIT - largest,
        "the budget is used, not idle: {usage:?}"
    );
    assert!(
        usage.used < total / 10,
        "producers were held back: {usage:?}"
    );
    assert!(usage.waiting > 0, "producers wait: {usage:?}");
    // Drain.
    drain_tx.send(true).unwrap();
    for p in producers {
        tokio::time::timeout(Duration::from_secs(60), p)
            .await
            .expect("every producer finishes")
            .unwrap();
    }
    let mut ids = std::collections::HashSet::new();
    for c in consumers {
        let (caller, got) = c.await.unwrap();
        let rows: Vec<i64> = got.iter().filter_map(connect::rows).collect();
        assert_eq!(
            rows,
            (1..=RESPONSES).collect::<Vec<_>>(),
            "in order, none lost"
        );
        assert!(got.last().unwrap().is_result_complete());
        for r in &got {
            assert!(ids.insert(r.response_id.clone()), "a duplicate response");
        }
        m.release_execute(&caller.release_all(&got[0].operation_id))
            .unwrap();
    }
    assert_eq!(ids.len(), EXECUTIONS * (RESPONSES as usize + 1));
    assert_eq!(m.execution_count(), 0);
    let end = m.memory_usage().unwrap();
    assert_eq!(end.used, 0, "every byte returned: {end:?}");
    assert!(end.peak <= bound, "{end:?}");
}

fn p_size(p: &tether::execution::Producer, payload: usize) -> u64 {
    let mut r: ExecutePlanResponse = connect::batch_of_len(i64::MAX, payload);
    let id = "00000000-0000-4000-8000-000000000000".to_owned();
    r.session_id = id.clone();
    r.server_side_session_id = p.server_side_session_id().to_string();
    r.operation_id = p.operation_id().to_owned();
    r.response_id = id;
    prost::Message::encoded_len(&r) as u64
}
