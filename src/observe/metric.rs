//! Each metric written once, and the one way both sides record it (see [`observe`](super)).
//!
//! A side keeps a `const` table of [`Metric`]s: the execution manager's in
//! `execution/observer.rs`; a worker session's in `worker/engine/events.rs` and a dispatcher's
//! worker processes' in `worker/dispatcher/events.rs`. The recorder's descriptions
//! ([`describe`]) and every series the side registers (`Metric::local_*`) come from that
//! table, and a standing check (`tests/checks`) holds the table in the module docs to the
//! tables. Series are recorded locally ([`LocalCounter`], [`LocalGauge`], [`LocalHistogram`]:
//! one relaxed atomic operation on the side's own memory, no call into the recorder) and
//! handed to the recorder when the side publishes them: the execution manager at each
//! maintenance pass, the worker side right after each event it reports.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Unit};

/// What kind of series a [`Metric`] is: Prometheus' types, as the `metrics` facade records
/// them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MetricKind {
    Counter,
    Gauge,
    Histogram,
}

/// One metric: its name (the one place the library writes it), kind, unit and description
/// (the recorder's `# HELP` line).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Metric {
    pub(crate) name: &'static str,
    pub(crate) kind: MetricKind,
    pub(crate) unit: Unit,
    pub(crate) help: &'static str,
}

/// Label pairs of one series (`[("status", "finished")]`); no label is unbounded.
type Labels<'a> = &'a [(&'static str, &'static str)];

impl Metric {
    /// A counter.
    pub(crate) const fn counter(name: &'static str, unit: Unit, help: &'static str) -> Self {
        Self {
            name,
            kind: MetricKind::Counter,
            unit,
            help,
        }
    }

    /// A gauge.
    pub(crate) const fn gauge(name: &'static str, unit: Unit, help: &'static str) -> Self {
        Self {
            name,
            kind: MetricKind::Gauge,
            unit,
            help,
        }
    }

    /// A histogram (of durations, published in seconds).
    pub(crate) const fn histogram(name: &'static str, unit: Unit, help: &'static str) -> Self {
        Self {
            name,
            kind: MetricKind::Histogram,
            unit,
            help,
        }
    }

    /// This counter's series with `labels`, registered with the recorder installed now.
    pub(crate) fn local_counter(&self, labels: Labels<'_>) -> LocalCounter {
        debug_assert_eq!(self.kind, MetricKind::Counter, "{}", self.name);
        LocalCounter::of(metrics::counter!(self.name, labels))
    }

    /// This gauge's series with `labels`, registered with the recorder installed now.
    pub(crate) fn local_gauge(&self, labels: Labels<'_>) -> LocalGauge {
        debug_assert_eq!(self.kind, MetricKind::Gauge, "{}", self.name);
        LocalGauge::of(metrics::gauge!(self.name, labels))
    }

    /// This histogram's series with `labels`, registered with the recorder installed now.
    pub(crate) fn local_histogram(&self, labels: Labels<'_>) -> LocalHistogram {
        debug_assert_eq!(self.kind, MetricKind::Histogram, "{}", self.name);
        LocalHistogram::of(metrics::histogram!(self.name, labels))
    }
}

/// The metric of both sides' event channels (label `side`: `connect`, `udf`): events a full
/// channel dropped. In both sides' tables.
pub(crate) const EVENTS_DROPPED: Metric = Metric::counter(
    "tether_events_dropped_total",
    Unit::Count,
    "Events a full channel dropped, by side.",
);

/// Hands each metric's unit and description in `table` to the installed recorder (its
/// `# HELP` lines).
pub(crate) fn describe(table: &[Metric]) {
    for m in table {
        match m.kind {
            MetricKind::Counter => metrics::describe_counter!(m.name, m.unit, m.help),
            MetricKind::Gauge => metrics::describe_gauge!(m.name, m.unit, m.help),
            MetricKind::Histogram => metrics::describe_histogram!(m.name, m.unit, m.help),
        }
    }
}

/// Held while a side publishes its series, so that its publications do not overlap (see
/// [`LocalGauge::publish`]). The standard library's lock, not the `sync` facade's: metrics
/// are no part of what the loom models check.
#[derive(Debug, Default)]
pub(crate) struct PublishLock(std::sync::Mutex<()>);

impl PublishLock {
    /// Waits for a publication in progress, then holds the lock.
    pub(crate) fn hold(&self) -> std::sync::MutexGuard<'_, ()> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A counter of the facade, counted on the side's own memory and handed to the recorder when
/// the side publishes: an increment is one relaxed atomic add, not a call into the recorder
/// (which, for a Prometheus recorder, is two atomics behind a virtual call). Published as the
/// increase since the last publication, so that the counters of several managers or
/// dispatchers in one process add up.
pub(crate) struct LocalCounter {
    handle: Counter,
    /// Counted since the last publication.
    count: AtomicU64,
}

impl LocalCounter {
    fn of(handle: Counter) -> Self {
        Self {
            handle,
            count: AtomicU64::new(0),
        }
    }

    pub(crate) fn increment(&self, n: u64) {
        self.count.fetch_add(n, Ordering::Relaxed);
    }

    /// Hands what was counted since the last publication to the recorder.
    pub(crate) fn publish(&self) {
        // Relaxed suffices: an increment after the swap is published the next time.
        if self.count.load(Ordering::Relaxed) == 0 {
            return;
        }
        let n = self.count.swap(0, Ordering::Relaxed);
        if n > 0 {
            self.handle.increment(n);
        }
    }
}

/// A gauge of the facade, set or moved on the side's own memory ([`set`](Self::set) a
/// sample, [`add`](Self::add) a change) and handed to the recorder when the side publishes,
/// as the change since its last publication, so that the gauges of several managers or
/// dispatchers in one process add up. Its values are whole numbers (counts and bytes).
pub(crate) struct LocalGauge {
    handle: Gauge,
    value: AtomicI64,
    /// The value last handed to the recorder.
    published: AtomicI64,
}

impl LocalGauge {
    fn of(handle: Gauge) -> Self {
        Self {
            handle,
            value: AtomicI64::new(0),
            published: AtomicI64::new(0),
        }
    }

    /// A sample of the value.
    pub(crate) fn set(&self, value: u64) {
        let value = i64::try_from(value).unwrap_or(i64::MAX);
        self.value.store(value, Ordering::Relaxed);
    }

    /// A change of the value.
    pub(crate) fn add(&self, change: i64) {
        self.value.fetch_add(change, Ordering::Relaxed);
    }

    /// Hands the change since the last publication to the recorder. Publications of one
    /// gauge must not overlap (each side publishes under its own lock): a later publication
    /// overtaken by an earlier one would leave the recorder behind until the next.
    pub(crate) fn publish(&self) {
        let now = self.value.load(Ordering::Relaxed);
        let before = self.published.swap(now, Ordering::Relaxed);
        if now != before {
            self.handle.increment(now as f64 - before as f64);
        }
    }
}

/// A histogram of the facade recorded on the side's own memory and handed to the recorder
/// when the side publishes, as [`LocalCounter`] does for counters: a sample is one relaxed
/// atomic add to a bucket, not a call into the recorder (which, for
/// `metrics-exporter-prometheus`, is a virtual call and a push into a growing sample buffer:
/// about 45 ns per sample in the registry benchmark, `docs/benchmarks.md`).
///
/// Samples are durations in nanoseconds, bucketed log-linearly: values below 32 ns each
/// have a bucket; above, each power of two is split into 32 equal buckets, so that a bucket
/// is at most 1/32 (3.1 %) of its values wide. A bucket is published as that many samples of
/// its midpoint, in seconds: a published value is within 1.6 % of the value recorded, which
/// is finer than the buckets or quantiles of any exporter built on it.
pub(crate) struct LocalHistogram {
    handle: Histogram,
    /// Samples since the last publication, by bucket ([`LocalHistogram::bucket`]).
    counts: Box<[AtomicU64]>,
}

/// Sub-buckets per power of two of a [`LocalHistogram`], as a shift (32).
const SUB_BITS: u32 = 5;
/// Buckets of a [`LocalHistogram`]: the 32 exact values below 32 ns, then 32 for each of the
/// 59 powers of two from 2^5 to 2^63 ns.
const BUCKETS: usize = (1 << SUB_BITS) * (64 - SUB_BITS as usize + 1);

impl LocalHistogram {
    fn of(handle: Histogram) -> Self {
        Self {
            handle,
            counts: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The bucket of a duration of `nanos` nanoseconds.
    fn bucket(nanos: u64) -> usize {
        let sub = 1u64 << SUB_BITS;
        if nanos < sub {
            return nanos as usize;
        }
        let power = 63 - nanos.leading_zeros(); // ≥ SUB_BITS
        let shift = power - SUB_BITS;
        let within = (nanos >> shift) - sub; // 0..32
        (sub as usize) * (shift as usize + 1) + within as usize
    }

    /// The midpoint of `bucket`, in seconds.
    fn midpoint_seconds(bucket: usize) -> f64 {
        let sub = 1usize << SUB_BITS;
        if bucket < sub {
            return bucket as f64 / 1e9;
        }
        let shift = (bucket / sub - 1) as i32;
        let within = (bucket % sub) as f64;
        let width = 2f64.powi(shift);
        ((sub as f64 + within) * width + width / 2.0) / 1e9
    }

    /// Records one duration.
    pub(crate) fn record(&self, d: Duration) {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.counts[Self::bucket(nanos)].fetch_add(1, Ordering::Relaxed);
    }

    /// Hands the samples since the last publication to the recorder.
    pub(crate) fn publish(&self) {
        for (bucket, count) in self.counts.iter().enumerate() {
            // Relaxed suffices: a sample counted after the load is published the next time.
            if count.load(Ordering::Relaxed) == 0 {
                continue;
            }
            let n = count.swap(0, Ordering::Relaxed);
            self.handle.record_many(
                Self::midpoint_seconds(bucket),
                usize::try_from(n).unwrap_or(usize::MAX),
            );
        }
    }
}

/// What a recorder was asked while `register` ran: the names it was given descriptions of,
/// and the names of the series registered with it. For the sides' tests: every series is of
/// a metric of the side's table, and every metric of the table has a series.
#[cfg(test)]
pub(crate) fn described_and_registered(
    register: impl FnOnce(),
) -> (
    std::collections::BTreeSet<String>,
    std::collections::BTreeSet<String>,
) {
    use std::collections::BTreeSet;
    use std::sync::Mutex;

    use metrics::{Key, KeyName, Metadata, SharedString};

    #[derive(Default)]
    struct Names {
        described: Mutex<BTreeSet<String>>,
        registered: Mutex<BTreeSet<String>>,
    }

    impl Names {
        fn describe(&self, name: KeyName) {
            self.described
                .lock()
                .unwrap()
                .insert(name.as_str().to_owned());
        }
        fn register(&self, key: &Key) {
            self.registered
                .lock()
                .unwrap()
                .insert(key.name().to_owned());
        }
    }

    impl metrics::Recorder for Names {
        fn describe_counter(&self, name: KeyName, _: Option<Unit>, _: SharedString) {
            self.describe(name);
        }
        fn describe_gauge(&self, name: KeyName, _: Option<Unit>, _: SharedString) {
            self.describe(name);
        }
        fn describe_histogram(&self, name: KeyName, _: Option<Unit>, _: SharedString) {
            self.describe(name);
        }
        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            self.register(key);
            Counter::noop()
        }
        fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
            self.register(key);
            Gauge::noop()
        }
        fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
            self.register(key);
            Histogram::noop()
        }
    }

    let names = Names::default();
    metrics::with_local_recorder(&names, register);
    (
        names.described.into_inner().unwrap(),
        names.registered.into_inner().unwrap(),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use super::{BUCKETS, LocalCounter, LocalGauge, LocalHistogram};

    #[test]
    fn a_histogram_bucket_holds_values_within_its_midpoint_s_precision() {
        let mut last = 0;
        for nanos in (0..4096u64)
            .chain((12..64).flat_map(|p| [(1u64 << p) - 1, 1 << p, (1 << p) + 12345]))
            .chain([u64::MAX])
        {
            let b = LocalHistogram::bucket(nanos);
            assert!(b < BUCKETS, "{nanos} ns: bucket {b}");
            if nanos < 4096 {
                assert!(b >= last, "buckets grow with the value: {nanos} ns");
                last = b;
            }
            let mid = LocalHistogram::midpoint_seconds(b) * 1e9;
            let error = (mid - nanos as f64).abs() / (nanos as f64).max(1.0);
            assert!(error <= 1.0 / 64.0 + 1e-9, "{nanos} ns → {mid} ns: {error}");
        }
        // The exact buckets below 32 ns, the first split power of two, the last bucket.
        assert_eq!(LocalHistogram::bucket(31), 31);
        assert_eq!(LocalHistogram::bucket(32), 32);
        assert_eq!(LocalHistogram::bucket(64), 64);
        assert_eq!(LocalHistogram::bucket(u64::MAX), BUCKETS - 1);
    }

    /// Keeps what the recorder was handed.
    #[derive(Default)]
    struct Samples(std::sync::Mutex<Vec<f64>>);

    impl metrics::HistogramFn for Samples {
        fn record(&self, value: f64) {
            self.0.lock().unwrap().push(value);
        }
    }

    #[test]
    fn a_histogram_publishes_each_sample_once_near_its_value() {
        let samples = Arc::new(Samples::default());
        let h = LocalHistogram::of(metrics::Histogram::from_arc(samples.clone()));
        let recorded = [
            Duration::ZERO,
            Duration::from_nanos(700),
            Duration::from_micros(250),
            Duration::from_millis(3),
            Duration::from_millis(3),
            Duration::from_secs(90),
        ];
        for d in recorded {
            h.record(d);
        }
        h.publish();
        let mut seen = samples.0.lock().unwrap().clone();
        seen.sort_by(f64::total_cmp);
        assert_eq!(seen.len(), recorded.len());
        for (d, s) in recorded.iter().zip(&seen) {
            let want = d.as_secs_f64();
            assert!((s - want).abs() <= want / 64.0, "{d:?} published as {s} s");
        }
        // Published once: a second pass with nothing new hands over nothing.
        h.publish();
        assert_eq!(samples.0.lock().unwrap().len(), recorded.len());
        h.record(Duration::from_millis(1));
        h.publish();
        assert_eq!(samples.0.lock().unwrap().len(), recorded.len() + 1);
    }

    /// A counter's or gauge's value as the recorder holds it (gauges as `f64` bits).
    #[derive(Default)]
    struct Value(AtomicU64);

    impl metrics::CounterFn for Value {
        fn increment(&self, n: u64) {
            self.0.fetch_add(n, Ordering::Relaxed);
        }
        fn absolute(&self, n: u64) {
            self.0.store(n, Ordering::Relaxed);
        }
    }

    impl metrics::GaugeFn for Value {
        fn increment(&self, change: f64) {
            let now = f64::from_bits(self.0.load(Ordering::Relaxed)) + change;
            self.0.store(now.to_bits(), Ordering::Relaxed);
        }
        fn decrement(&self, change: f64) {
            metrics::GaugeFn::increment(self, -change);
        }
        fn set(&self, value: f64) {
            self.0.store(value.to_bits(), Ordering::Relaxed);
        }
    }

    #[test]
    fn counters_and_gauges_reach_the_recorder_only_when_published_and_once() {
        let total = Arc::new(Value::default());
        let c = LocalCounter::of(metrics::Counter::from_arc(total.clone()));
        c.increment(2);
        c.increment(3);
        assert_eq!(total.0.load(Ordering::Relaxed), 0, "not yet published");
        c.publish();
        c.publish();
        assert_eq!(total.0.load(Ordering::Relaxed), 5);

        let level = Arc::new(Value::default());
        let read = || f64::from_bits(level.0.load(Ordering::Relaxed));
        let g = LocalGauge::of(metrics::Gauge::from_arc(level.clone()));
        g.add(3);
        g.add(-1);
        assert_eq!(read(), 0.0, "not yet published");
        g.publish();
        g.publish();
        assert_eq!(read(), 2.0);
        g.set(7);
        g.publish();
        assert_eq!(read(), 7.0);
        // Published as the change: a second gauge of the same series adds to it.
        let other = LocalGauge::of(metrics::Gauge::from_arc(level.clone()));
        other.set(4);
        other.publish();
        assert_eq!(read(), 11.0);
    }
}
