//! The engine side of the tour: the seven scenarios, each driving real worker processes
//! through a [`Dispatcher`], printing its progress and recording a summary row and checks.

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::error::Error;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{Array, AsArray};
use arrow::datatypes::{Float64Type, Int64Type};
use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use futures::StreamExt;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tether::wire::{Init, UdfPayload, UdfWorkerDataFormat};
use tether::worker::dispatcher::{Dispatcher, WorkerInfo};
use tether::worker::engine::{Session, Termination, TerminationKind, WorkerHandle};
use tether::worker::engine::{WorkerAddress, WorkerTransport};
use tether::worker::state;

use super::data::Dataset;
use super::ipc;
use super::table::{self, Table};
use super::udf::PAYLOAD_FORMAT;

/// Errors that end the tour early (the scenarios' expected failures are outcomes, not
/// errors).
pub type TourResult<T> = Result<T, Box<dyn Error>>;

/// The numeric UDF of the finished, SIGKILL, concurrent and pool scenarios.
const RATIO: &str = "expr:bill_ratio = bill_length_mm / bill_depth_mm";
/// A UDF that divides by zero for the penguins observed in 2009 (from row 100 on).
const DIVIDES_BY_ZERO: &str = "expr:mass_per_year = body_mass_g / (year - 2009)";

// ---------------------------------------------------------------------------------------------
// Bookkeeping
// ---------------------------------------------------------------------------------------------

/// Engine-side traffic of one session: `DataRequest`s sent, `DataResponse`s received.
#[derive(Debug, Default)]
struct Traffic {
    batches_in: Cell<u64>,
    batches_out: Cell<u64>,
    bytes_in: Cell<u64>,
    bytes_out: Cell<u64>,
}

impl Traffic {
    fn sent(&self, b: &Bytes) {
        self.batches_in.set(self.batches_in.get() + 1);
        self.bytes_in.set(self.bytes_in.get() + b.len() as u64);
    }

    fn received(&self, b: &Bytes) {
        self.batches_out.set(self.batches_out.get() + 1);
        self.bytes_out.set(self.bytes_out.get() + b.len() as u64);
    }
}

/// One line of the summary table.
#[derive(Debug)]
struct Row {
    id: String,
    scenario: String,
    outcome: String,
    batches: String,
    bytes: String,
    elapsed: Duration,
    worker: String,
}

/// What the tour recorded: summary rows, checks, every worker it saw.
#[derive(Debug, Default)]
pub struct Report {
    rows: Vec<Row>,
    checks: Vec<(String, bool)>,
    /// pid → socket path (or endpoint) of every worker a session ran on.
    workers: BTreeMap<u32, Option<PathBuf>>,
    /// Workers the tour killed with SIGKILL.
    kills: usize,
}

impl Report {
    /// Records a check and prints it.
    pub fn check(&mut self, what: impl Into<String>, ok: bool) {
        let what = what.into();
        println!("    {} {what}", if ok { "✓" } else { "✗" });
        self.checks.push((what, ok));
    }

    fn saw(&mut self, info: &WorkerInfo) {
        let socket = match &info.address {
            WorkerAddress::Unix(p) => Some(p.clone()),
            WorkerAddress::Tcp(_) => None,
        };
        self.workers.insert(info.pid, socket);
    }

    /// Every worker process a session ran on: pid and socket path.
    pub fn workers(&self) -> &BTreeMap<u32, Option<PathBuf>> {
        &self.workers
    }

    /// How many workers the tour killed with SIGKILL.
    pub fn kills(&self) -> usize {
        self.kills
    }

    /// (passed, total) checks.
    pub fn score(&self) -> (usize, usize) {
        let passed = self.checks.iter().filter(|(_, ok)| *ok).count();
        (passed, self.checks.len())
    }

    /// The failed checks.
    pub fn failures(&self) -> Vec<&str> {
        self.checks
            .iter()
            .filter(|(_, ok)| !ok)
            .map(|(what, _)| what.as_str())
            .collect()
    }

    /// The summary table.
    pub fn table(&self) -> String {
        let mut t = Table::new(&[
            "#",
            "scenario",
            "outcome",
            ">batches in→out",
            ">bytes in / out",
            ">time",
            "worker",
        ]);
        for r in &self.rows {
            t.row(vec![
                r.id.clone(),
                r.scenario.clone(),
                r.outcome.clone(),
                r.batches.clone(),
                r.bytes.clone(),
                table::duration(r.elapsed),
                r.worker.clone(),
            ]);
        }
        t.render()
    }

    fn row(
        &mut self,
        id: &str,
        scenario: &str,
        outcome: String,
        traffic: &Traffic,
        elapsed: Duration,
        worker: String,
    ) {
        self.rows.push(Row {
            id: id.to_string(),
            scenario: scenario.to_string(),
            outcome,
            batches: format!(
                "{} → {}",
                traffic.batches_in.get(),
                traffic.batches_out.get()
            ),
            bytes: format!(
                "{} / {}",
                table::bytes(traffic.bytes_in.get()),
                table::bytes(traffic.bytes_out.get())
            ),
            elapsed,
            worker,
        });
    }
}

/// A short label for the summary table.
fn outcome_label(t: &Termination) -> String {
    match (t.kind(), t.execution_error()) {
        (TerminationKind::Cancelled, Some(e)) => match e.error_class() {
            Some(class) => format!("Cancelled ← UserError[{class}]"),
            None => format!("Cancelled ← {e}"),
        },
        (TerminationKind::Cancelled, None) => "Cancelled".to_string(),
        (TerminationKind::Finished, _) => "Finished".to_string(),
        (TerminationKind::TransportFailed, _) => "TransportFailed".to_string(),
        (kind, _) => format!("{kind:?}"),
    }
}

/// The worker column: pid, new or reused, invalidated.
fn worker_label(info: &WorkerInfo, seq: Option<u64>, handle: &dyn WorkerHandle) -> String {
    let mut s = format!("pid {}", info.pid);
    match seq {
        Some(n) if n > 1 => s += &format!(", reused (session #{n})"),
        _ if info.sessions_served > 0 => s += ", reused",
        _ => s += ", new",
    }
    if handle.is_invalid() {
        s += ", invalidated";
    }
    s
}

/// A worker-reported metric, as a number.
fn metric(t: &Termination, name: &str) -> Option<u64> {
    t.metrics()?.get(name)?.parse().ok()
}

/// Whether a process with this pid exists (a zombie counts: it has not been reaped).
pub fn process_exists(pid: u32) -> bool {
    i32::try_from(pid).is_ok_and(|pid| kill(Pid::from_raw(pid), None).is_ok())
}

/// An error and its causes on one line (each error states itself; the cause is its
/// `source()`).
pub fn chain(error: &dyn Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text += &format!(": {e}");
        source = e.source();
    }
    text
}

/// `text` cut to one readable line (transport errors can be long).
fn clip(text: &str) -> String {
    const MAX: usize = 110;
    let line = text.lines().next().unwrap_or_default();
    if line.chars().count() <= MAX {
        line.to_string()
    } else {
        format!("{}…", line.chars().take(MAX).collect::<String>())
    }
}

fn step(id: &str, title: &str) {
    println!();
    println!("[{id}] {title}");
}

/// The output batches of `DataResponse` payloads.
fn decode_outputs(outputs: &[Bytes]) -> TourResult<Vec<RecordBatch>> {
    let mut batches = Vec::new();
    for out in outputs {
        batches.extend(ipc::decode_stream(out)?.1);
    }
    Ok(batches)
}

// ---------------------------------------------------------------------------------------------
// The tour
// ---------------------------------------------------------------------------------------------

/// A session the dispatcher created, with the worker it runs on.
struct Opened<C> {
    session: Session<state::Init, C>,
    info: WorkerInfo,
    handle: Arc<dyn WorkerHandle>,
}

/// What a session run to its end produced.
struct Completed {
    termination: Termination,
    outputs: Vec<Bytes>,
    traffic: Traffic,
    info: WorkerInfo,
    handle: Arc<dyn WorkerHandle>,
    elapsed: Duration,
}

/// The engine: two dispatchers over the same worker executable, the data set, the report.
pub struct Tour<'a, T: WorkerTransport> {
    /// Spark's behaviour: a fresh worker per session, stopped when the session ends.
    spark: &'a Dispatcher<T>,
    /// tether's opt-in reuse pool (the spec declares `supports_reuse`).
    pooled: &'a Dispatcher<T>,
    data: &'a Dataset,
    /// The data set's batches as Arrow IPC streams, one per `DataRequest`.
    inputs: Vec<Bytes>,
    input_schema: Bytes,
    /// What happened.
    pub report: Report,
}

impl<'a, T> Tour<'a, T>
where
    T: WorkerTransport,
{
    /// A tour over `data` with the two dispatchers.
    pub fn new(
        spark: &'a Dispatcher<T>,
        pooled: &'a Dispatcher<T>,
        data: &'a Dataset,
    ) -> TourResult<Self> {
        let inputs = data
            .batches
            .iter()
            .map(ipc::encode_batch)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Tour {
            spark,
            pooled,
            data,
            inputs,
            input_schema: ipc::encode_schema(&data.schema)?,
            report: Report::default(),
        })
    }

    /// Runs every scenario in order.
    pub async fn run(&mut self) -> TourResult<()> {
        self.finished().await?;
        self.cancelled_midway().await?;
        self.user_error().await?;
        self.sigkill(self.spark, "4", "SIGKILL mid-stream").await?;
        self.generator().await?;
        self.concurrent().await?;
        self.pool_reuse().await?;
        Ok(())
    }

    /// The `Init` for `udf`: Arrow data, the input schema, Spark-style context.
    fn init(&self, udf: &str) -> Init {
        let mut payload = UdfPayload::new(Bytes::copy_from_slice(udf.as_bytes()), PAYLOAD_FORMAT);
        payload.name = udf.split_once(':').map(|(kind, _)| format!("tour_{kind}"));
        let mut init = Init::new(UdfWorkerDataFormat::Arrow, payload);
        init.protocol_version = Some(1);
        if !udf.starts_with("generate:") {
            init.input_schema = Some(self.input_schema.clone());
        }
        init.task_context = [
            ("partitionId", "0"),
            ("stageId", "1"),
            ("taskAttemptId", "7"),
            ("driverId", "driver"),
            ("isDriver", "false"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        init.session_conf
            .insert("spark.sql.ansi.enabled".into(), "true".into());
        init.timezone = Some("UTC".into());
        init
    }

    /// Creates a session on `dispatcher` and looks up its worker.
    async fn open(dispatcher: &Dispatcher<T>) -> TourResult<Opened<T::Connection>> {
        let session = dispatcher.create_session().await?;
        let handle = session.worker().clone();
        let info = dispatcher
            .worker(handle.id())
            .ok_or("the session's worker is not tracked by the dispatcher")?;
        Ok(Opened {
            session,
            info,
            handle,
        })
    }

    /// Runs `udf` over `inputs` to the end with `Session::process` (Spark's pull-based
    /// iterator: the next batch goes out when no output is waiting; `Finish` after the last).
    async fn run_to_end(
        &self,
        dispatcher: &Dispatcher<T>,
        udf: &str,
        inputs: &[Bytes],
    ) -> TourResult<Completed> {
        let started = Instant::now();
        let opened = Self::open(dispatcher).await?;
        let (session, _) = opened
            .session
            .init(self.init(udf))
            .await
            .map_err(|f| f.error)?;
        let traffic = Traffic::default();
        let input = futures::stream::iter(inputs.iter().cloned()).inspect(|b| traffic.sent(b));
        let mut stream = session.process(input);
        let mut outputs = Vec::new();
        while let Some(item) = stream.next().await {
            match item {
                Ok(batch) => {
                    traffic.received(&batch);
                    outputs.push(batch);
                }
                // The session's error; the Termination says all.
                Err(_) => break,
            }
        }
        let termination = stream.close().await;
        Ok(Completed {
            termination,
            outputs,
            traffic,
            info: opened.info,
            handle: opened.handle,
            elapsed: started.elapsed(),
        })
    }

    /// Sends and receives `batches` one at a time (lock-step) on a streaming session.
    async fn lock_step(
        session: &mut Session<state::Streaming, T::Connection>,
        batches: &[Bytes],
        traffic: &Traffic,
    ) -> TourResult<()> {
        for batch in batches {
            session.send(batch.clone()).await?;
            traffic.sent(batch);
            if let Some(out) = session.recv().await? {
                traffic.received(&out);
            }
        }
        Ok(())
    }

    // 1 -------------------------------------------------------------------------------------

    async fn finished(&mut self) -> TourResult<()> {
        step(
            "1",
            &format!("finished: `{RATIO}` over all {} penguins", self.data.rows()),
        );
        let done = self.run_to_end(self.spark, RATIO, &self.inputs).await?;
        self.report.saw(&done.info);
        let t = &done.termination;
        println!("    worker pid {} on {}", done.info.pid, done.info.address);
        println!("    termination: {t}");
        // The UDF output is row-aligned with the input: join it back to the species.
        let outputs = decode_outputs(&done.outputs)?;
        let mut by_species: BTreeMap<String, (f64, u32)> = BTreeMap::new();
        let mut rows_out = 0;
        for (input, output) in self.data.batches.iter().zip(&outputs) {
            rows_out += output.num_rows();
            let species = input
                .column_by_name("species")
                .ok_or("no species column")?
                .as_string::<i32>();
            let ratio = output.column(0).as_primitive::<Float64Type>();
            for row in 0..output.num_rows() {
                if ratio.is_valid(row) && species.is_valid(row) {
                    let e = by_species
                        .entry(species.value(row).to_string())
                        .or_default();
                    e.0 += ratio.value(row);
                    e.1 += 1;
                }
            }
        }
        let means: Vec<String> = by_species
            .iter()
            .map(|(s, (sum, n))| format!("{s} {:.2} (n={n})", sum / f64::from(*n)))
            .collect();
        println!("    mean bill_ratio per species: {}", means.join(", "));
        if let Some(m) = t.metrics() {
            let keys = [
                "rows_in",
                "rows_out",
                "batches_in",
                "batches_out",
                "work_wall_nanos",
            ];
            let shown: Vec<String> = keys
                .iter()
                .filter_map(|k| m.get(*k).map(|v| format!("{k}={v}")))
                .collect();
            println!("    worker metrics (FinishResponse): {}", shown.join(" "));
        }
        self.report.check(
            "Finished; every row came back (rows in = rows out)",
            t.kind() == TerminationKind::Finished
                && rows_out == self.data.rows()
                && metric(t, "rows_in") == Some(self.data.rows() as u64),
        );
        let worker = worker_label(&done.info, metric(t, "worker_session_seq"), &*done.handle);
        self.report.row(
            "1",
            "finished session",
            outcome_label(t),
            &done.traffic,
            done.elapsed,
            worker,
        );
        Ok(())
    }

    // 2 -------------------------------------------------------------------------------------

    async fn cancelled_midway(&mut self) -> TourResult<()> {
        const SENT: usize = 4;
        let udf = "upper:species";
        step(
            "2",
            &format!(
                "cancelled midway: `{udf}`, Cancel after {SENT} of {} batches",
                self.inputs.len()
            ),
        );
        let started = Instant::now();
        let opened = Self::open(self.spark).await?;
        self.report.saw(&opened.info);
        let (mut session, _) = opened
            .session
            .init(self.init(udf))
            .await
            .map_err(|f| f.error)?;
        let traffic = Traffic::default();
        Self::lock_step(&mut session, &self.inputs[..SENT], &traffic).await?;
        let cancel_sent = Instant::now();
        let session = session
            .cancel(Some("tour: the consumer has all the rows it needs".into()))
            .await;
        let session = session.wait().await;
        let ack = cancel_sent.elapsed();
        let t = session.close().await;
        println!(
            "    termination: {t} — CancelResponse after {}",
            table::duration(ack)
        );
        println!(
            "    partial metrics (CancelResponse): batches_in={} rows_in={}",
            metric(&t, "batches_in").unwrap_or(0),
            metric(&t, "rows_in").unwrap_or(0)
        );
        self.report.check(
            format!("Cancelled; worker saw exactly {SENT} batches and stays valid"),
            t.kind() == TerminationKind::Cancelled
                && metric(&t, "batches_in") == Some(SENT as u64)
                && !opened.handle.is_invalid(),
        );
        let worker = worker_label(
            &opened.info,
            metric(&t, "worker_session_seq"),
            &*opened.handle,
        );
        self.report.row(
            "2",
            "cancelled midway",
            outcome_label(&t),
            &traffic,
            started.elapsed(),
            worker,
        );
        Ok(())
    }

    // 3 -------------------------------------------------------------------------------------

    async fn user_error(&mut self) -> TourResult<()> {
        step(
            "3",
            &format!("worker-reported user error: `{DIVIDES_BY_ZERO}` (2009 rows divide by zero)"),
        );
        let done = self
            .run_to_end(self.spark, DIVIDES_BY_ZERO, &self.inputs)
            .await?;
        self.report.saw(&done.info);
        let t = &done.termination;
        let error = t.execution_error();
        println!(
            "    {} output batches, then: {}",
            done.outputs.len(),
            error.map_or_else(
                || "no error".to_string(),
                |e| { e.to_string().lines().next().unwrap_or_default().to_string() }
            )
        );
        if let Some(context) = error.and_then(|e| e.message().split_once("== UDF ==\n")) {
            println!("    at: {}", context.1);
        }
        println!(
            "    the engine pipelined {} batches; the worker processed {} and dropped the rest unread",
            done.traffic.batches_in.get(),
            metric(t, "batches_in").unwrap_or(0)
        );
        println!("    termination: {}", outcome_label(t));
        self.report.check(
            "UserError[DIVIDE_BY_ZERO] after the earlier batches' output; Cancelled; worker still valid",
            t.kind() == TerminationKind::Cancelled
                && error.and_then(|e| e.error_class()) == Some("DIVIDE_BY_ZERO")
                && !done.outputs.is_empty()
                && t.is_salvageable()
                && !done.handle.is_invalid(),
        );
        let worker = worker_label(&done.info, metric(t, "worker_session_seq"), &*done.handle);
        self.report.row(
            "3",
            "user error (ANSI divide)",
            outcome_label(t),
            &done.traffic,
            done.elapsed,
            worker,
        );
        Ok(())
    }

    // 4 (and 7c) ----------------------------------------------------------------------------

    /// Runs a session, SIGKILLs its worker after three batches, and checks the aftermath.
    /// Returns the killed worker's pid.
    async fn sigkill(
        &mut self,
        dispatcher: &Dispatcher<T>,
        id: &str,
        title: &str,
    ) -> TourResult<u32> {
        const BEFORE_KILL: usize = 3;
        step(
            id,
            &format!("{title}: `{RATIO}`, worker killed with SIGKILL after {BEFORE_KILL} batches"),
        );
        let started = Instant::now();
        let opened = Self::open(dispatcher).await?;
        self.report.saw(&opened.info);
        let pid = opened.info.pid;
        let (mut session, _) = opened
            .session
            .init(self.init(RATIO))
            .await
            .map_err(|f| f.error)?;
        let traffic = Traffic::default();
        Self::lock_step(&mut session, &self.inputs[..BEFORE_KILL], &traffic).await?;
        let raw_pid = i32::try_from(pid)?;
        kill(Pid::from_raw(raw_pid), Signal::SIGKILL)?;
        self.report.kills += 1;
        println!("    kill -9 {pid}");
        // Keep streaming: the next send or receive meets the dead socket.
        let mut seen = None;
        for batch in &self.inputs[BEFORE_KILL..] {
            if let Err(e) = session.send(batch.clone()).await {
                seen = Some(e);
                break;
            }
            traffic.sent(batch);
            match session.recv().await {
                Ok(Some(out)) => traffic.received(&out),
                Ok(None) => break,
                Err(e) => {
                    seen = Some(e);
                    break;
                }
            }
        }
        if let Some(e) = seen {
            println!("    the engine saw: {}", clip(&chain(&e)));
        }
        let t = session.close().await;
        let elapsed = started.elapsed();
        println!("    termination: {}", clip(&t.to_string()));
        let invalid = opened.handle.is_invalid();
        // The worker's stop (reap, socket removal) runs in the background: wait for it.
        dispatcher.settle().await;
        let gone = !process_exists(pid);
        let socket = match &opened.info.address {
            WorkerAddress::Unix(p) => Some(p.clone()),
            WorkerAddress::Tcp(_) => None,
        };
        let socket_gone = socket.as_ref().is_none_or(|p| !p.exists());
        let tracked = dispatcher.worker(opened.handle.id()).is_some();
        println!(
            "    worker {pid}: invalidated={invalid}, process reaped={gone}, socket removed={socket_gone}, still tracked={tracked}"
        );
        self.report.check(
            "TransportFailed; worker invalidated, reaped, socket file removed, not kept",
            t.kind() == TerminationKind::TransportFailed
                && invalid
                && gone
                && socket_gone
                && !tracked,
        );
        let worker = format!("pid {pid}, killed → invalidated");
        self.report
            .row(id, title, outcome_label(&t), &traffic, elapsed, worker);
        Ok(pid)
    }

    // 5 -------------------------------------------------------------------------------------

    async fn generator(&mut self) -> TourResult<()> {
        let udf = "generate:1000";
        step("5", &format!("generator with zero inputs: `{udf}`"));
        let done = self.run_to_end(self.spark, udf, &[]).await?;
        self.report.saw(&done.info);
        let t = &done.termination;
        let batches = decode_outputs(&done.outputs)?;
        let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
        let last = batches.last().and_then(|b| {
            let n = b.num_rows().checked_sub(1)?;
            let id = b.column_by_name("id")?.as_primitive::<Int64Type>().value(n);
            let sq = b
                .column_by_name("square")?
                .as_primitive::<Int64Type>()
                .value(n);
            Some((id, sq))
        });
        println!(
            "    Finish right after InitResponse; {} output batches, {rows} rows, last row {:?}",
            done.outputs.len(),
            last
        );
        println!("    termination: {t}");
        self.report.check(
            "Finished with 0 batches in, 1000 generated rows out",
            t.kind() == TerminationKind::Finished
                && done.traffic.batches_in.get() == 0
                && rows == 1000
                && last == Some((999, 998_001)),
        );
        let worker = worker_label(&done.info, metric(t, "worker_session_seq"), &*done.handle);
        self.report.row(
            "5",
            "generator, zero inputs",
            outcome_label(t),
            &done.traffic,
            done.elapsed,
            worker,
        );
        Ok(())
    }

    // 6 -------------------------------------------------------------------------------------

    async fn concurrent(&mut self) -> TourResult<()> {
        let udfs = [
            ("6a", RATIO),
            ("6b", "upper:island"),
            (
                "6c",
                "expr:flipper_per_kg = flipper_length_mm / (body_mass_g / 1000)",
            ),
            ("6d", "lower:sex"),
        ];
        step("6", &format!("{} concurrent sessions", udfs.len()));
        let started = Instant::now();
        let runs = udfs
            .iter()
            .map(|(_, udf)| self.run_to_end(self.spark, udf, &self.inputs));
        let results = futures::future::join_all(runs).await;
        let wall = started.elapsed();
        let mut pids = BTreeSet::new();
        let mut all_finished = true;
        let mut sum = Duration::ZERO;
        for ((id, udf), result) in udfs.iter().zip(results) {
            let done = result?;
            self.report.saw(&done.info);
            pids.insert(done.info.pid);
            sum += done.elapsed;
            let t = &done.termination;
            all_finished &= t.kind() == TerminationKind::Finished
                && metric(t, "rows_out") == Some(self.data.rows() as u64);
            println!(
                "    {id} `{udf}` on pid {}: {t} in {}",
                done.info.pid,
                table::duration(done.elapsed)
            );
            let worker = worker_label(&done.info, metric(t, "worker_session_seq"), &*done.handle);
            self.report.row(
                id,
                "concurrent session",
                outcome_label(t),
                &done.traffic,
                done.elapsed,
                worker,
            );
        }
        println!(
            "    wall time {} for {} of session time",
            table::duration(wall),
            table::duration(sum)
        );
        self.report.check(
            format!(
                "all {} Finished with every row, each on its own worker process",
                udfs.len()
            ),
            all_finished && pids.len() == udfs.len(),
        );
        Ok(())
    }

    // 7 -------------------------------------------------------------------------------------

    async fn pool_reuse(&mut self) -> TourResult<()> {
        step(
            "7",
            "pool reuse (spec declares supports_reuse; dispatcher pool opt-in)",
        );
        let mut first_pid = None;
        for (id, udf) in [("7a", RATIO), ("7b", "upper:island")] {
            let done = self.run_to_end(self.pooled, udf, &self.inputs).await?;
            self.report.saw(&done.info);
            let t = &done.termination;
            let seq = metric(t, "worker_session_seq");
            println!(
                "    {id} `{udf}` on pid {} ({}): {t}",
                done.info.pid,
                if done.info.sessions_served > 0 {
                    "reused from the pool"
                } else {
                    "spawned"
                }
            );
            let idle: Vec<u32> = self
                .pooled
                .workers()
                .iter()
                .filter(|w| w.idle)
                .map(|w| w.pid)
                .collect();
            println!("       idle in the pool afterwards: {idle:?}");
            match first_pid {
                None => {
                    first_pid = Some(done.info.pid);
                    self.report.check(
                        "7a Finished; its healthy worker parked idle in the pool",
                        t.kind() == TerminationKind::Finished && idle.contains(&done.info.pid),
                    );
                }
                Some(first) => self.report.check(
                    "7b reused 7a's worker process (same pid, its 2nd session)",
                    t.kind() == TerminationKind::Finished
                        && done.info.pid == first
                        && seq == Some(2),
                ),
            }
            let worker = worker_label(&done.info, seq, &*done.handle);
            self.report.row(
                id,
                "pooled session",
                outcome_label(t),
                &done.traffic,
                done.elapsed,
                worker,
            );
        }
        // An invalidated worker never goes back to the pool.
        let killed = self
            .sigkill(self.pooled, "7c", "pooled worker SIGKILLed")
            .await?;
        let done = self.run_to_end(self.pooled, RATIO, &self.inputs).await?;
        self.report.saw(&done.info);
        println!(
            "    7d `{RATIO}` on pid {} ({}): {}",
            done.info.pid,
            if done.info.sessions_served > 0 {
                "reused"
            } else {
                "spawned"
            },
            done.termination
        );
        self.report.check(
            "7d got a new worker: the invalidated one was never reused",
            done.termination.kind() == TerminationKind::Finished
                && done.info.pid != killed
                && done.info.sessions_served == 0,
        );
        let stats = self.pooled.stats();
        println!(
            "    pool stats: spawned={} reused={} stopped={}",
            stats.spawned, stats.reused, stats.stopped
        );
        let worker = worker_label(
            &done.info,
            metric(&done.termination, "worker_session_seq"),
            &*done.handle,
        );
        self.report.row(
            "7d",
            "after invalidation",
            outcome_label(&done.termination),
            &done.traffic,
            done.elapsed,
            worker,
        );
        Ok(())
    }
}
