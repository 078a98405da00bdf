//! Benchmarks of the server side of reattachable executions (issue 4 "Benchmarks").
//!
//! - `reattach/{10,100000}`: ReattachExecute positioned at the last delivered response of an
//!   execution that produced 10 vs 100 000 responses (positioning must not scan; target
//!   ratio ≤ 1.5).
//! - `lifecycle/manager` vs `lifecycle/mutex_hashmap`: ExecutePlan + start (attach) +
//!   ReleaseAll with 100 000 live executions, against a bare `Mutex<HashMap>` insert/remove
//!   of the same three request strings (target ≥ 0.5 of the baseline's throughput).
//! - `maintenance/100000`: one abandonment pass over 100 000 attached executions
//!   (target < 50 ms).
//! - A printed summary with the ratios (the lifecycle one paired: 30 rounds alternating the
//!   arms ABBA, the median of the per-round ratios with its interquartile range, each arm
//!   first run once through its 65 536 operation ids so that both are measured in the steady
//!   state), and memory per idle execution measured as the resident-set growth of 100 000
//!   idle executions (target ≤ 2 KiB).
//!
//! - `observed`: the same lifecycle on a manager built with a Prometheus recorder installed
//!   (`metrics-exporter-prometheus`, rendering nothing) and an event listener attached (a
//!   thread reading every event in batches, once a millisecond), against a manager with
//!   neither; paired ABBA like the lifecycle ratio (target ≥ 0.97: observability costs at
//!   most 3 %).
//!
//! Every run uses glibc's malloc with the mmap and trim thresholds pinned, as
//! `benches/udf_session.rs` explains (`benches/common/malloc.rs`;
//! `TETHER_BENCH_MALLOC=default` keeps glibc's own): the bare map's arm alone moved between
//! about 400 and 900 ns per cycle from run to run with glibc's dynamic thresholds.
//!
//! Needs `[[bench]] name = "execution" harness = false` in Cargo.toml. Run with
//! `cargo bench --bench execution`.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion};
use tether::execution::{ConsumerEvent, ExecutionManager, ManagerConfig, Producer, ResponseStream};
use tether::wire::connect::{
    ExecutePlanRequest, ExecutePlanResponse, ReattachExecuteRequest, ReleaseExecuteRequest,
};
use tether_testing::connect::{Caller, ManualManager, start};
use uuid::Uuid;

const USER: &str = "bench-user";

fn manager() -> ExecutionManager {
    ManualManager::new(ManagerConfig {
        max_executions_per_session: usize::MAX,
        // ids are cycled: let a released id be submitted again at once (its inactive
        // record is still written and checked, so the cost is unchanged)
        inactive_operation_expiry: Duration::ZERO,
        ..ManagerConfig::default()
    })
    .manager
}

fn execute_request(session: &str, op: &str) -> ExecutePlanRequest {
    Caller::new(USER, session).execute(op)
}

fn release_all(session: &str, op: &str) -> ReleaseExecuteRequest {
    Caller::new(USER, session).release_all(op)
}

/// An execution that produced and delivered `n` responses; returns the reattach request
/// positioned at the last one.
fn produced(m: &ExecutionManager, n: usize) -> (ReattachExecuteRequest, Producer) {
    let session = Uuid::new_v4().to_string();
    let op = Uuid::new_v4().to_string();
    let (mut p, mut s) = start(m, &execute_request(&session, &op));
    let mut last = String::new();
    for i in 0..n {
        p.try_push(ExecutePlanResponse::arrow_batch(
            i as i64,
            Bytes::from_static(&[0; 16]),
        ))
        .expect("push");
        match s.try_next() {
            ConsumerEvent::Response(r) => last = r.response_id,
            other => panic!("{other:?}"),
        }
    }
    let req = Caller::new(USER, &session).reattach(&op, Some(&last));
    (req, p)
}

fn reattach_once(m: &ExecutionManager, req: &ReattachExecuteRequest) {
    let s = m.reattach_execute(req).expect("reattach");
    black_box(&s);
    drop(s);
}

/// `n` live executions spread over sessions of 100.
fn populated(n: usize) -> (ExecutionManager, Vec<(Producer, ResponseStream)>) {
    populated_with(manager(), n)
}

/// `n` live executions of `m`, spread over sessions of 100.
fn populated_with(
    m: ExecutionManager,
    n: usize,
) -> (ExecutionManager, Vec<(Producer, ResponseStream)>) {
    let mut keep = Vec::with_capacity(n);
    let mut session = Uuid::new_v4().to_string();
    for i in 0..n {
        if i % 100 == 0 {
            session = Uuid::new_v4().to_string();
        }
        keep.push(start(
            &m,
            &execute_request(&session, &Uuid::new_v4().to_string()),
        ));
    }
    (m, keep)
}

/// Operation ids per lifecycle arm, cycled through: an id is submitted again one cycle after
/// it was released.
const ID_CYCLE: usize = 1 << 16;

/// Runs a lifecycle arm through one full cycle of its [`ID_CYCLE`] operation ids before it is
/// measured, so that every id it submits was released one cycle earlier: its inactive record
/// exists and is out of cache, as in the steady state. A fresh arm's first cycle (the first
/// three rounds of a pair) submits ids that were never released, with no record to read,
/// and runs faster: measured fresh, the manager arm gained about 0.01–0.02 on the lifecycle
/// ratio, and a second bare manager (the method's control) measured about 1 % faster than
/// the warm first one (docs/benchmarks.md).
fn warmed<F: FnMut()>(mut arm: F) -> F {
    for _ in 0..ID_CYCLE {
        arm();
    }
    arm
}

/// Operation ids generated up front (a UUID v4 costs a `getrandom` syscall, which would
/// dominate both sides), cycled through.
struct Ids {
    ids: Vec<String>,
    next: usize,
}

impl Ids {
    fn new(n: usize) -> Self {
        Ids {
            ids: (0..n).map(|_| Uuid::new_v4().to_string()).collect(),
            next: 0,
        }
    }

    fn next(&mut self) -> &str {
        self.next = (self.next + 1) % self.ids.len();
        &self.ids[self.next]
    }
}

/// ExecutePlan + start (attach the initial stream) + ReleaseAll. Re-submitting a released id
/// would be refused for 30 minutes, so each call uses a fresh session id from `sessions`.
fn lifecycle_once(
    m: &ExecutionManager,
    req: &mut ExecutePlanRequest,
    release: &mut ReleaseExecuteRequest,
    session: &str,
    op: &str,
) {
    req.session_id.clear();
    req.session_id.push_str(session);
    req.operation_id = Some(op.to_owned());
    let started = start(m, req);
    black_box(&started);
    release.session_id.clear();
    release.session_id.push_str(session);
    release.operation_id.clear();
    release.operation_id.push_str(op);
    let r = m.release_execute(release).expect("release");
    black_box(r);
}

type Baseline = Mutex<HashMap<(String, String, String), Arc<()>>>;

/// The same three request strings as the key, an `Arc` as the value: insert, then remove.
fn baseline_once(map: &Baseline, user: &str, session: &str, op: &str) {
    let key = (user.to_owned(), session.to_owned(), op.to_owned());
    map.lock().unwrap().insert(key.clone(), Arc::new(()));
    let removed = map.lock().unwrap().remove(&key);
    black_box(removed);
}

fn baseline_populated(n: usize) -> Baseline {
    let mut map = HashMap::with_capacity(n + 1);
    for _ in 0..n {
        map.insert(
            (
                USER.to_owned(),
                Uuid::new_v4().to_string(),
                Uuid::new_v4().to_string(),
            ),
            Arc::new(()),
        );
    }
    Mutex::new(map)
}

fn bench_reattach(c: &mut Criterion) {
    let mut g = c.benchmark_group("reattach");
    for n in [10usize, 100_000] {
        let m = manager();
        let (req, _p) = produced(&m, n);
        g.bench_with_input(BenchmarkId::from_parameter(n), &req, |b, req| {
            b.iter(|| reattach_once(&m, req))
        });
    }
    g.finish();
}

fn bench_lifecycle(c: &mut Criterion) {
    let mut g = c.benchmark_group("lifecycle");
    let (m, _keep) = populated(100_000);
    let session = Uuid::new_v4().to_string();
    let mut req = execute_request(&session, "");
    let mut release = release_all(&session, "");
    let mut ids = Ids::new(ID_CYCLE);
    let mut sessions = Ids::new(64);
    g.bench_function("manager", |b| {
        b.iter(|| {
            let s = sessions.next().to_owned();
            lifecycle_once(&m, &mut req, &mut release, &s, ids.next())
        })
    });
    let map = baseline_populated(100_000);
    g.bench_function("mutex_hashmap", |b| {
        b.iter(|| {
            let s = sessions.next().to_owned();
            baseline_once(&map, USER, &s, ids.next())
        })
    });
    g.finish();
}

fn bench_maintenance(c: &mut Criterion) {
    let mut g = c.benchmark_group("maintenance");
    g.sample_size(20);
    let (m, _keep) = populated(100_000);
    g.bench_function("100000", |b| b.iter(|| black_box(m.maintain())));
    g.finish();
}

/// Rounds of the paired lifecycle comparison in the summary.
const PAIRED_ROUNDS: usize = 30;
/// Iterations per arm per round.
const PAIRED_CHUNK: u32 = 20_000;

/// [`PAIRED_ROUNDS`] rounds of both arms, alternating which runs first (ABBA), so that both
/// arms of a round see the same machine load: the per-round throughput ratios of `a` to `b`
/// (b's time ÷ a's), and each arm's times per iteration, sorted.
fn paired(a: &mut impl FnMut(), b: &mut impl FnMut()) -> (Vec<f64>, Vec<Duration>, Vec<Duration>) {
    let mut ratios = Vec::with_capacity(PAIRED_ROUNDS);
    let (mut a_times, mut b_times) = (Vec::new(), Vec::new());
    for round in 0..PAIRED_ROUNDS {
        let (t_a, t_b) = if round % 2 == 0 {
            let t_a = time_per_iter(PAIRED_CHUNK, &mut *a);
            (t_a, time_per_iter(PAIRED_CHUNK, &mut *b))
        } else {
            let t_b = time_per_iter(PAIRED_CHUNK, &mut *b);
            (time_per_iter(PAIRED_CHUNK, &mut *a), t_b)
        };
        ratios.push(t_b.as_secs_f64() / t_a.as_secs_f64());
        a_times.push(t_a);
        b_times.push(t_b);
    }
    a_times.sort();
    b_times.sort();
    (ratios, a_times, b_times)
}

/// First quartile, median and third quartile of `xs` (sorted in place).
fn quartiles(xs: &mut [f64]) -> (f64, f64, f64) {
    xs.sort_by(f64::total_cmp);
    let at = |q: f64| xs[((xs.len() - 1) as f64 * q).round() as usize];
    (at(0.25), at(0.5), at(0.75))
}

fn time_per_iter(iters: u32, mut f: impl FnMut()) -> Duration {
    for _ in 0..iters / 10 {
        f();
    }
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    t.elapsed() / iters
}

fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// Resident-set growth per idle execution: 100 000 registered, started executions with no
/// buffered response and no attached stream (detached), measured first in a fresh process.
/// Includes the registry's per-execution share and the kept `Producer` handle (one pointer).
fn memory_per_idle_execution() -> Option<u64> {
    const N: usize = 100_000;
    let m = manager();
    let mut producers = Vec::with_capacity(N);
    let sessions: Vec<String> = (0..N / 100).map(|_| Uuid::new_v4().to_string()).collect();
    let ops: Vec<String> = (0..N).map(|_| Uuid::new_v4().to_string()).collect();
    let mut req = execute_request("", "");
    let before = resident_bytes()?;
    for (i, op) in ops.iter().enumerate() {
        req.session_id.clone_from(&sessions[i / 100]);
        req.operation_id = Some(op.clone());
        let (p, s) = start(&m, &req);
        drop(s);
        producers.push(p);
    }
    let after = resident_bytes()?;
    black_box((&m, &producers));
    Some(after.saturating_sub(before) / N as u64)
}

/// Prints the ratios and the memory figure, measured in this run.
fn summary(memory: Option<u64>) {
    println!("\n== execution benchmark summary ==");
    if let Some(bytes) = memory {
        println!("memory per idle execution: {bytes} bytes (target ≤ 2048)");
    }
    let m = manager();
    let (small, _p1) = produced(&m, 10);
    let (large, _p2) = produced(&m, 100_000);
    let t_small = time_per_iter(200_000, || reattach_once(&m, &small));
    let t_large = time_per_iter(200_000, || reattach_once(&m, &large));
    println!(
        "reattach latency: 10 responses {t_small:?}, 100 000 responses {t_large:?}, ratio {:.2} (target ≤ 1.5)",
        t_large.as_secs_f64() / t_small.as_secs_f64()
    );

    let (m, keep) = populated(100_000);
    let mut req = execute_request("", "");
    let mut release = release_all("", "");
    let mut ids = Ids::new(ID_CYCLE);
    let mut sessions = Ids::new(64);
    let map = baseline_populated(100_000);
    let mut manager_arm = warmed(|| {
        let s = sessions.next().to_owned();
        lifecycle_once(&m, &mut req, &mut release, &s, ids.next())
    });
    let mut map_ids = Ids::new(ID_CYCLE);
    let mut map_sessions = Ids::new(64);
    let mut map_arm = warmed(|| {
        let s = map_sessions.next().to_owned();
        baseline_once(&map, USER, &s, map_ids.next())
    });
    // Paired rounds (ABBA): both arms of a round see the same machine load.
    let (mut ratios, manager_times, map_times) = paired(&mut manager_arm, &mut map_arm);
    let (lo, median, hi) = quartiles(&mut ratios);
    println!(
        "create+attach+release with 100 000 live (paired, median of {PAIRED_ROUNDS} ABBA rounds of {PAIRED_CHUNK}): manager {:?}, Mutex<HashMap> {:?}, throughput ratio {median:.3} [IQR {lo:.3}–{hi:.3}] (target ≥ 0.5)",
        manager_times[PAIRED_ROUNDS / 2],
        map_times[PAIRED_ROUNDS / 2],
    );
    let t_maint = time_per_iter(20, || {
        black_box(m.maintain());
    });
    println!("maintenance pass over 100 000 executions: {t_maint:?} (target < 50 ms)");
    drop((m, keep, map));
    observed_summary();
}

/// A thread that reads everything `pop` yields in batches, once a millisecond (see
/// `tether::observe` on reading at high event rates), until `finish`: the event listener of
/// the observed arm, and the reader of the raw ring of its floor.
struct Drainer<S> {
    stop: Arc<std::sync::atomic::AtomicBool>,
    read: Arc<std::sync::atomic::AtomicU64>,
    thread: std::thread::JoinHandle<(u64, S)>,
}

impl<S: Send + 'static> Drainer<S> {
    fn start<T: 'static>(mut source: S, pop: fn(&mut S) -> Option<T>) -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let read = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (stopping, reading) = (stop.clone(), read.clone());
        let thread = std::thread::spawn(move || {
            let mut n = 0u64;
            loop {
                let done = stopping.load(std::sync::atomic::Ordering::Acquire);
                while let Some(e) = pop(&mut source) {
                    black_box(&e);
                    n += 1;
                }
                reading.store(n, std::sync::atomic::Ordering::Relaxed);
                if done {
                    return (n, source);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        Self { stop, read, thread }
    }

    /// The items read so far, once the source is empty (after `populated_with`).
    fn settled(&self) -> u64 {
        std::thread::sleep(Duration::from_millis(20));
        self.read.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stops the thread; the items it read, and the source.
    fn finish(self) -> (u64, S) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        self.thread.join().expect("the draining thread")
    }
}

type Listener = Drainer<tether::observe::EventReceiver<tether::execution::ExecutionEvent>>;

/// A manager like [`manager`] built with a Prometheus recorder installed (its handles are
/// registered with it; nothing renders) and an event listener attached.
///
/// `TETHER_BENCH_OBSERVE=metrics` (the recorder alone) or `events` (the listener alone)
/// measures one half; the default is both.
fn observed_manager() -> (ExecutionManager, Listener) {
    let half = std::env::var("TETHER_BENCH_OBSERVE").unwrap_or_default();
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let (tx, rx) = tether::observe::event_channel(1 << 16);
    let config = ManagerConfig {
        max_executions_per_session: usize::MAX,
        inactive_operation_expiry: Duration::ZERO,
        events: (half != "metrics").then_some(tx),
        ..ManagerConfig::default()
    };
    let m = if half == "events" {
        ManualManager::new(config).manager
    } else {
        metrics::with_local_recorder(&recorder, || ManualManager::new(config).manager)
    };
    // The recorder must outlive the handles the manager registered: leak it (one per run).
    Box::leak(Box::new(recorder));
    (m, Drainer::start(rx, |rx| rx.try_recv()))
}

/// The events one registry lifecycle of the observed arm publishes: `OperationStarted`,
/// `Released { until: None }`, `OperationCanceled` and `OperationClosed` (the 64 sessions'
/// `SessionStarted` are too few to count).
const EVENTS_PER_LIFECYCLE: u64 = 4;

/// The floor of delivering events to another thread at all: a bare `crossbeam_queue`
/// ring of `ExecutionEvent`s (the ring `tether::observe::event_channel` is built on, the
/// same capacity) that a [`Drainer`] reads, as the observed arm's listener does.
type RawRing = Arc<crossbeam_queue::ArrayQueue<tether::execution::ExecutionEvent>>;

/// Observability's cost on the registry lifecycle: paired ABBA rounds of the observed
/// manager (recorder + listener) against the bare one, same populations, same requests; and
/// against the bare one plus the raw cost of handing the same number of equally large events
/// to another thread ([`RawRing`]): what is left above that floor is tether's own.
fn observed_summary() {
    let (bare, _keep_bare) = populated_with(manager(), 100_000);
    let (observed, listener) = observed_manager();
    let (observed, keep_observed) = populated_with(observed, 100_000);
    let before = listener.settled();
    let lifecycles = std::rc::Rc::new(std::cell::Cell::new(0u64));
    let arm = |m: &ExecutionManager| {
        let mut req = execute_request("", "");
        let mut release = release_all("", "");
        let mut ids = Ids::new(ID_CYCLE);
        let mut sessions = Ids::new(64);
        let m = m.clone();
        move || {
            let s = sessions.next().to_owned();
            lifecycle_once(&m, &mut req, &mut release, &s, ids.next())
        }
    };
    let mut bare_arm = warmed(arm(&bare));
    let mut observed_arm = warmed({
        let (mut run, count) = (arm(&observed), lifecycles.clone());
        move || {
            count.set(count.get() + 1);
            run()
        }
    });
    let (mut ratios, observed_times, bare_times) = paired(&mut observed_arm, &mut bare_arm);
    let (lo, median, hi) = quartiles(&mut ratios);
    // The floor: the bare lifecycle, then the same events into a raw ring.
    let ring: RawRing = Arc::new(crossbeam_queue::ArrayQueue::new(1 << 16));
    let raw = Drainer::start(ring.clone(), |q| q.pop());
    let event = tether::execution::ExecutionEvent {
        at: Instant::now(),
        session_id: Uuid::new_v4(),
        operation_id: Some(Uuid::new_v4()),
        kind: tether::execution::ExecutionEventKind::OperationCanceled,
    };
    let mut floor_arm = {
        let (queue, mut bare_arm) = (ring.clone(), warmed(arm(&bare)));
        move || {
            bare_arm();
            for _ in 0..EVENTS_PER_LIFECYCLE {
                let _ = queue.push(black_box(event.clone()));
            }
        }
    };
    let (mut floor_ratios, _, floor_times) = paired(&mut observed_arm, &mut floor_arm);
    let (flo, fmedian, fhi) = quartiles(&mut floor_ratios);
    drop((observed_arm, keep_observed, observed, floor_arm));
    let resolution = method_resolution(&bare, &mut bare_arm, &arm);
    let (events, rx) = listener.finish();
    let dropped = rx.dropped();
    let (raw_events, _) = raw.finish();
    let observed_lifecycles = lifecycles.get();
    let half = std::env::var("TETHER_BENCH_OBSERVE").unwrap_or_default();
    if half != "metrics" {
        let per = (events + dropped - before) as f64 / observed_lifecycles as f64;
        assert!(
            (per - EVENTS_PER_LIFECYCLE as f64).abs() < 0.1,
            "the observed arm published {per:.2} events per lifecycle, the floor arm {EVENTS_PER_LIFECYCLE}"
        );
    }
    let what = match half.as_str() {
        "metrics" => "recorder alone",
        "events" => "listener alone",
        _ => "recorder + listener",
    };
    println!(
        "create+attach+release observed ({what}, {events} events read, {dropped} dropped) vs bare (paired, median of {PAIRED_ROUNDS} ABBA rounds of {PAIRED_CHUNK}): observed {:?}, bare {:?}, throughput ratio {median:.3} [IQR {lo:.3}–{hi:.3}] (target ≥ 0.97)",
        observed_times[PAIRED_ROUNDS / 2],
        bare_times[PAIRED_ROUNDS / 2],
    );
    if half == "metrics" {
        return;
    }
    resolution.print();
    println!(
        "create+attach+release observed ({what}) vs bare + {EVENTS_PER_LIFECYCLE} events into a raw ring drained by a thread ({raw_events} read; the floor of any listener on another thread): floor {:?}, throughput ratio {fmedian:.3} [IQR {flo:.3}–{fhi:.3}]",
        floor_times[PAIRED_ROUNDS / 2],
    );
}

/// Two controls printed beside the observed arm's ratios, so that every run shows what the
/// paired method can resolve and what the least possible event costs.
struct Resolution {
    /// A second bare manager, built and populated as the first, against the first: the
    /// method's own spread (ideally 1.0).
    same: (f64, f64, f64),
    /// The bare manager plus [`EVENTS_PER_LIFECYCLE`] 16-byte records (the smallest event
    /// that could name an execution: a key and a timestamp) into a ring another thread
    /// drains, against the bare manager.
    minimal: (f64, f64, f64),
}

impl Resolution {
    fn print(&self) {
        let ((slo, s, shi), (mlo, m, mhi)) = (self.same, self.minimal);
        println!(
            "create+attach+release, controls: a second bare manager vs the first (the method's resolution) {s:.3} [IQR {slo:.3}–{shi:.3}]; bare + {EVENTS_PER_LIFECYCLE} 16-byte records into a raw ring drained by a thread vs bare {m:.3} [IQR {mlo:.3}–{mhi:.3}]"
        );
    }
}

/// Measures the [`Resolution`] controls against `bare`'s arm.
fn method_resolution<A: FnMut()>(
    bare: &ExecutionManager,
    bare_arm: &mut impl FnMut(),
    arm: &impl Fn(&ExecutionManager) -> A,
) -> Resolution {
    let (twin, keep_twin) = populated_with(manager(), 100_000);
    let mut twin_arm = warmed(arm(&twin));
    let (mut same, _, _) = paired(&mut twin_arm, bare_arm);
    drop((twin_arm, keep_twin, twin));
    let ring = Arc::new(crossbeam_queue::ArrayQueue::<[u64; 2]>::new(1 << 16));
    let reader = Drainer::start(ring.clone(), |q| q.pop());
    let mut minimal_arm = {
        let (ring, mut run, mut key) = (ring.clone(), warmed(arm(bare)), 0u64);
        move || {
            run();
            for _ in 0..EVENTS_PER_LIFECYCLE {
                key += 1;
                let _ = ring.push(black_box([key, key ^ 0x5a5a]));
            }
        }
    };
    let (mut minimal, _, _) = paired(&mut minimal_arm, bare_arm);
    drop(reader.finish());
    Resolution {
        same: quartiles(&mut same),
        minimal: quartiles(&mut minimal),
    }
}

#[path = "common/malloc.rs"]
mod malloc;

fn main() {
    let malloc = malloc::pin();
    println!("malloc: {malloc} (TETHER_BENCH_MALLOC=default for glibc's own)");
    let memory = memory_per_idle_execution();
    let mut c = Criterion::default().configure_from_args();
    bench_reattach(&mut c);
    bench_lifecycle(&mut c);
    bench_maintenance(&mut c);
    c.final_summary();
    summary(memory);
}
