//! The runner shared by tether's state-machine models (issue 11 item 1): one
//! `ReferenceStateMachine` + `StateMachineTest` per core, each run here with its depth taken
//! from `tether_testing::model_cases` (`TETHER_MODEL_CASES`), and a tally of what flowed
//! through the cases so that a deep run shows its "0 lost or duplicated responses" (udf §2
//! R5: every batch of a `Finished` session crossed once, in order; rx §3: every response
//! delivered exactly once, in order).

use std::fmt::Debug;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, TestRunner};
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};

/// Counts over every case of one model: the responses (or batches) whose delivery the model
/// checked, and how many of them it found lost or duplicated.
#[derive(Debug, Default)]
pub struct Tally {
    cases: AtomicU64,
    delivered: AtomicU64,
    lost: AtomicU64,
    duplicated: AtomicU64,
}

impl Tally {
    /// An empty tally, for a `static`.
    pub const fn new() -> Self {
        Tally {
            cases: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            duplicated: AtomicU64::new(0),
        }
    }

    /// Records one case's delivery check, then fails the case if anything was lost or
    /// duplicated (the recorded counts make a failing deep run show how many).
    pub fn record(&self, what: &str, delivered: u64, lost: u64, duplicated: u64) {
        self.cases.fetch_add(1, Ordering::Relaxed);
        self.delivered.fetch_add(delivered, Ordering::Relaxed);
        self.lost.fetch_add(lost, Ordering::Relaxed);
        self.duplicated.fetch_add(duplicated, Ordering::Relaxed);
        assert_eq!(lost, 0, "{lost} {what} lost");
        assert_eq!(duplicated, 0, "{duplicated} {what} duplicated");
    }
}

/// The proptest configuration of every model: `tether_testing::model_cases(default_cases)`
/// cases, a generous shrink budget, no persisted failures (a failing case prints its seed
/// and its shrunk transitions instead).
pub fn config(default_cases: u32) -> Config {
    Config {
        cases: tether_testing::model_cases(default_cases),
        max_shrink_iters: 4096,
        // A model with preconditions filters transitions; proptest counts every filtered
        // one against a per-run limit (65 536 by default) that a deep run would exhaust.
        max_local_rejects: u32::MAX,
        failure_persistence: None,
        ..Config::default()
    }
}

/// `n` values of `strategy` drawn by a deterministic runner (the same on every run): for the
/// tests that check a model's generators reach every outcome (a generator that only ever
/// produces early failures would leave the rules behind them untested).
#[allow(
    dead_code,
    reason = "each model test compiles this module; not all of them sample"
)]
pub fn samples<S: Strategy>(strategy: S, n: usize) -> Vec<S::Value> {
    let mut runner = TestRunner::deterministic();
    (0..n)
        .map(|_| strategy.new_tree(&mut runner).expect("strategy").current())
        .collect()
}

/// Runs the state machine `H` for `tether_testing::model_cases(default_cases)` cases of
/// `steps` transitions each (shrinking a failure), then prints one summary line: cases,
/// time, cases/s and the tally (`--nocapture` shows it), and checks the tally once more.
pub fn run<H>(name: &str, what: &str, default_cases: u32, steps: Range<usize>, tally: &Tally)
where
    H: StateMachineTest,
    <H::Reference as ReferenceStateMachine>::State: Clone + Debug,
    <H::Reference as ReferenceStateMachine>::Transition: Clone + Debug,
{
    let config = config(default_cases);
    let cases = config.cases;
    let mut runner = TestRunner::new(config.clone());
    let started = Instant::now();
    let result = runner.run(
        &<H::Reference as ReferenceStateMachine>::sequential_strategy(steps),
        |(initial, transitions, seen)| {
            H::test_sequential(config.clone(), initial, transitions, seen);
            Ok(())
        },
    );
    if let Err(e) = result {
        panic!("model {name} failed: {e}");
    }
    let secs = started.elapsed().as_secs_f64();
    let checked = tally.cases.load(Ordering::Relaxed);
    let delivered = tally.delivered.load(Ordering::Relaxed);
    let lost = tally.lost.load(Ordering::Relaxed);
    let duplicated = tally.duplicated.load(Ordering::Relaxed);
    eprintln!(
        "model {name}: {cases} cases in {secs:.1} s ({:.0} cases/s); {delivered} {what} \
         checked in {checked} cases: {lost} lost, {duplicated} duplicated",
        f64::from(cases) / secs.max(1e-9)
    );
    assert!(checked >= u64::from(cases), "the tally missed cases");
    assert_eq!((lost, duplicated), (0, 0), "{what} lost or duplicated");
}
