//! Reading what tether's metrics added up to in a test: [`MetricTotals`] over
//! `metrics-util`'s debugging recorder (the metric table of `tether::observe`: executions,
//! rx §2.1 item 4; worker sessions and processes, udf §4.1, §6).

use std::collections::HashMap;
use std::sync::Mutex;

use metrics_util::debugging::{DebugValue, Snapshotter};

/// A recorder's values as totals, the way a Prometheus scrape of tether's metrics reads them
/// (rx §2.1 item 4, udf §4.1, §6): the debugging recorder's snapshot hands out what changed
/// since the last one (it swaps every counter and gauge to 0), so each read adds the new
/// snapshot to the totals. Right for counters, histograms (samples counted) and gauges that
/// only go up and down; a gauge that is `set` reads as the sum of its sets.
///
/// Install the recorder while the object under test registers its handles
/// (`metrics::with_local_recorder(&recorder, || …)`): they keep recording into it afterwards.
pub struct MetricTotals {
    snap: Snapshotter,
    totals: Mutex<HashMap<String, f64>>,
}

impl MetricTotals {
    /// Totals of the recorder behind `snap` (`DebuggingRecorder::snapshotter`), read from
    /// now on (the metric table of `tether::observe`, rx §2.1 item 4, udf §4.1).
    pub fn new(snap: Snapshotter) -> Self {
        Self {
            snap,
            totals: Mutex::default(),
        }
    }

    /// One metric's total by name, summed over every series whose labels include `labels`
    /// (0 when never recorded; the names of `tether::observe`, rx §2.1 item 4, udf §4.1).
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let mut totals = self.totals.lock().unwrap_or_else(|e| e.into_inner());
        for (k, _, _, v) in self.snap.snapshot().into_vec() {
            let key = k.key();
            let mut id = key.name().to_owned();
            let mut ls: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            ls.sort();
            for l in ls {
                id.push(' ');
                id.push_str(&l);
            }
            let add = match v {
                DebugValue::Counter(c) => c as f64,
                DebugValue::Gauge(g) => g.into_inner(),
                DebugValue::Histogram(h) => h.len() as f64,
            };
            *totals.entry(id).or_insert(0.0) += add;
        }
        totals
            .iter()
            .filter(|(id, _)| {
                let mut parts = id.split(' ');
                parts.next() == Some(name)
                    && labels
                        .iter()
                        .all(|(l, v)| id.split(' ').any(|p| p == format!("{l}={v}")))
            })
            .map(|(_, v)| *v)
            .sum()
    }
}
