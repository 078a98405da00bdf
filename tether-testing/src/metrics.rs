//! Reading tether's metrics in a test: [`MetricTotals`], a recorder of the `metrics` facade
//! that keeps every series' current value (the metric table of `tether::observe`: executions,
//! rx §2.1 item 4; worker sessions and processes, udf §4.1, §6).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use metrics::{
    Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};

/// A histogram's samples.
#[derive(Debug, Default)]
struct Samples(Mutex<Vec<f64>>);

impl HistogramFn for Samples {
    fn record(&self, value: f64) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(value);
    }
}

#[derive(Debug, Clone)]
enum Series {
    Counter(Arc<AtomicU64>),
    /// The gauge's `f64` bits (`metrics` implements gauges on `AtomicU64` that way).
    Gauge(Arc<AtomicU64>),
    Histogram(Arc<Samples>),
}

/// A recorder that keeps the current value of every series, read without resetting it, the
/// way a Prometheus scrape reads tether's metrics (rx §2.1 item 4, udf §4.1, §6): counters
/// their total, gauges their last value, histograms their number of samples.
///
/// Install it while the object under test registers its handles
/// (`metrics::with_local_recorder(&*recorder, || …)`): they keep recording into it after.
#[derive(Debug, Default)]
pub struct MetricTotals {
    series: Mutex<HashMap<Key, Series>>,
}

impl MetricTotals {
    fn register(&self, key: &Key, make: impl FnOnce() -> Series) -> Series {
        self.series
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key.clone())
            .or_insert_with(make)
            .clone()
    }

    /// One metric's value by name, summed over every series whose labels include `labels`
    /// (0 when never registered; the names of `tether::observe`, rx §2.1 item 4, udf §4.1).
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let series = self.series.lock().unwrap_or_else(|e| e.into_inner());
        series
            .iter()
            .filter(|(key, _)| {
                key.name() == name
                    && labels
                        .iter()
                        .all(|(l, v)| key.labels().any(|x| x.key() == *l && x.value() == *v))
            })
            .map(|(_, s)| match s {
                Series::Counter(c) => c.load(Ordering::Acquire) as f64,
                Series::Gauge(g) => f64::from_bits(g.load(Ordering::Acquire)),
                Series::Histogram(h) => h.0.lock().unwrap_or_else(|e| e.into_inner()).len() as f64,
            })
            .sum()
    }
}

impl Recorder for MetricTotals {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        match self.register(key, || Series::Counter(Arc::default())) {
            Series::Counter(c) => Counter::from_arc(c),
            other => panic!("{key:?} registered as {other:?} and as a counter"),
        }
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        match self.register(key, || {
            Series::Gauge(Arc::new(AtomicU64::new(0f64.to_bits())))
        }) {
            Series::Gauge(g) => Gauge::from_arc(g),
            other => panic!("{key:?} registered as {other:?} and as a gauge"),
        }
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        match self.register(key, || Series::Histogram(Arc::default())) {
            Series::Histogram(h) => Histogram::from_arc(h),
            other => panic!("{key:?} registered as {other:?} and as a histogram"),
        }
    }
}
