//! The example Spark Connect server (`tests/support/test_server`, examples/connect_server with stats lines and faults) as a real process on
//! loopback, read by two clients:
//!
//! - tether's own [`ConnectClient`] + [`ReattachingStream`] (always runs): Spark's batch
//!   layout, schemas, `count()`, `limit()`, an unsupported plan's error;
//! - the real PySpark client, pyspark-client 4.2.0 from `target/pyspark-venv`
//!   (`scripts/pyspark-env.sh`, run by `scripts/test.sh`), running
//!   `tests/python/pyspark_checks.py`: `collect()`, `toArrow()`, `toLocalIterator()`,
//!   `count()` and `limit()` with stream rotation after every response and the server's
//!   `--faults` on, every release reaching the server, abandonment of what a client leaves
//!   behind, the token, `toPandas()` and the Config answers; and
//!   `tests/python/connect_scenarios.py`: Spark's errors and Config answers for
//!   unknown, duplicate and abandoned operations (with the exception class PySpark raises),
//!   a killed client's execution abandoned, and users isolated within one session id.
//!   Without the venv these tests print SKIPPED (and fail under `CI=true`).
//!
//! The server binary is built on first use with `cargo build --example connect_test_server` and
//! the features this test was built with (a no-op when `cargo test` already built the
//! examples); `TETHER_CONNECT_SERVER` names a prebuilt one instead.
#![cfg(feature = "spark-connect")]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use arrow::array::AsArray;
use arrow::datatypes::Int64Type;
use futures::StreamExt;
use prost::Message;
use tether::execution::client::{ClientConfig, ReattachingStream};
use tether::spark::connect::ConnectClient;
use tether::wire::connect::{
    AnalyzePlanRequest, DataType, ExecutePlanRequest, Plan, Relation, UserContext,
    analyze_plan_request, analyze_plan_response, data_type, execute_plan_response::ResponseType,
};

const ROWS: i64 = 200_000;

pub(crate) fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

// ---------------------------------------------------------------------------------------------
// The server process
// ---------------------------------------------------------------------------------------------

/// `target/<profile>/examples/connect_test_server`, built once per test process.
fn server_binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| match std::env::var_os("TETHER_CONNECT_SERVER") {
        Some(path) => PathBuf::from(path),
        None => example_binary("connect_test_server"),
    })
}

/// `target/<profile>/examples/NAME`, built with `cargo build --example NAME` and this test's
/// features (a no-op when `cargo test` already built the examples).
pub(crate) fn example_binary(name: &str) -> PathBuf {
    // This test runs as target/<profile>/deps/pyspark_connect-<hash>.
    let exe = std::env::current_exe().expect("the test's path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>");
    let target_dir = profile_dir.parent().expect("the target directory");
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev",
        Some(other) => other,
    };
    // The same features as this test, so the library built for it is reused.
    let features: Vec<&str> = [
        ("tokio", cfg!(feature = "tokio")),
        ("grpc", cfg!(feature = "grpc")),
        ("spark-connect", cfg!(feature = "spark-connect")),
    ]
    .into_iter()
    .filter_map(|(name, on)| on.then_some(name))
    .collect();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| env!("CARGO").into());
    let output = Command::new(cargo)
        .args(["build", "--quiet", "--example", name])
        .args(["--profile", profile, "--no-default-features", "--features"])
        .arg(features.join(","))
        .arg("--manifest-path")
        .arg(repo().join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir)
        .stdin(Stdio::null())
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success(),
        "building examples/{name} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    profile_dir.join("examples").join(name)
}

/// The counters of the server's last `stats …` line.
pub(crate) type Stats = BTreeMap<String, u64>;

pub(crate) fn parse_stats(line: &str) -> Option<Stats> {
    line.strip_prefix("stats ")?
        .split_whitespace()
        .map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect()
}

/// The server arguments that end every stream after one response (123 bytes) or 1 s, as
/// Spark's own reattach tests configure it: every execution is read across reattaches.
const ROTATE_EVERY_RESPONSE: [&str; 4] = [
    "--max-stream-bytes",
    "123",
    "--max-stream-duration-ms",
    "1000",
];

/// A running `connect_server`, killed on drop (its log printed if the test failed).
pub(crate) struct Server {
    child: Child,
    pub(crate) port: u16,
    stats: Arc<Mutex<Option<Stats>>>,
    log: Arc<Mutex<String>>,
    /// Every line of its stdout.
    out: Arc<Mutex<Vec<String>>>,
}

impl Server {
    /// The server with [`ROTATE_EVERY_RESPONSE`] and `args`.
    pub(crate) fn rotating(args: &[&str]) -> Self {
        Self::start(&[&ROTATE_EVERY_RESPONSE[..], args].concat())
    }

    pub(crate) fn start(args: &[&str]) -> Self {
        Self::start_binary(
            server_binary(),
            &[&["--stats-interval-ms", "50"], args].concat(),
        )
    }

    /// `binary` (a server that prints `listening on ADDRESS`) with `--port 0` and `args`.
    pub(crate) fn start_binary(binary: &Path, args: &[&str]) -> Self {
        let mut child = Command::new(binary)
            .args(["--port", "0"])
            .args(args)
            .env("RUST_LOG", "info,tether::spark::connect=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the example server starts");
        let stats = Arc::new(Mutex::new(None));
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let latest = stats.clone();
        let out = Arc::new(Mutex::new(Vec::new()));
        let lines = out.clone();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line.clone());
                if let Some(address) = line.strip_prefix("listening on ") {
                    let _ = tx.send(address.to_owned());
                } else if let Some(s) = parse_stats(&line) {
                    *latest.lock().unwrap() = Some(s);
                }
            }
        });
        let stderr = BufReader::new(child.stderr.take().expect("piped stderr"));
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let mut server = Self {
            child,
            port: 0,
            stats,
            log,
            out,
        };
        let address = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("no `listening on` line from the server: {e}"));
        server.port = address
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
            .unwrap_or_else(|| panic!("bad address {address:?}"));
        server
    }

    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every stdout line so far.
    pub(crate) fn stdout_lines(&self) -> Vec<String> {
        self.out.lock().unwrap().clone()
    }

    /// The drain's report line (`drained …`), printed after a SIGTERM.
    pub(crate) fn drain_report(&self) -> String {
        let lines = self.stdout_lines();
        lines
            .iter()
            .find(|l| l.starts_with("drained "))
            .cloned()
            .unwrap_or_else(|| panic!("no drain report in {lines:?}"))
    }

    /// Sends SIGTERM (the example drains, then stops).
    pub(crate) fn terminate(&self) {
        self.signal("TERM");
    }

    /// Sends the signal named `name` (`kill -NAME`).
    pub(crate) fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{name} failed: {status}");
    }

    /// Waits (up to `within`) for the process to exit; its status.
    pub(crate) fn wait_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the server did not exit within {within:?}; stdout: {:?}",
                self.stdout_lines()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits (up to `within`) for a stats line satisfying `ok`, and returns it.
    pub(crate) fn wait_for_stats(
        &self,
        within: Duration,
        what: &str,
        ok: impl Fn(&Stats) -> bool,
    ) -> Stats {
        let deadline = Instant::now() + within;
        loop {
            let latest = self.stats.lock().unwrap().clone();
            if let Some(s) = latest.as_ref().filter(|s| ok(s)) {
                return s.clone();
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not within {within:?}; last stats: {latest:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// How many log lines are the event `message` (the text after the target, before the
    /// fields: a line's span prefix names its RPC too).
    fn message_count(&self, message: &str) -> usize {
        let log = self.log.lock().unwrap();
        log.lines().filter(|l| is_message(l, message)).count()
    }

    fn log_count(&self, needle: &str) -> usize {
        self.log.lock().unwrap().matches(needle).count()
    }

    /// How many log lines contain every one of `needles`.
    pub(crate) fn log_lines_with(&self, needles: &[&str]) -> usize {
        let log = self.log.lock().unwrap();
        log.lines()
            .filter(|line| needles.iter().all(|n| line.contains(n)))
            .count()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = self.log.lock().unwrap();
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            eprintln!("--- the server's last log lines ---");
            for line in tail.iter().rev() {
                eprintln!("{line}");
            }
        }
    }
}

/// Whether the log line `line` is the event `message` (`…: target: MESSAGE fields`).
fn is_message(line: &str, message: &str) -> bool {
    line.contains(&format!(": {message} ")) || line.ends_with(&format!(": {message}"))
}

pub(crate) fn stat(s: &Stats, key: &str) -> u64 {
    *s.get(key)
        .unwrap_or_else(|| panic!("no `{key}` in stats {s:?}"))
}

// ---------------------------------------------------------------------------------------------
// tether's client
// ---------------------------------------------------------------------------------------------

const SESSION: &str = "5e55a0e5-0000-4000-8000-00000000c0de";

fn range_rel(end: i64) -> Relation {
    Relation::range(0, end, 1)
}

/// What one execution returned: the `schema` response's type, and per Arrow batch its
/// `row_count`, `start_offset` and the `bigint` values of its one column.
#[derive(Debug, Default)]
struct Outcome {
    schema: Option<DataType>,
    batches: Vec<(i64, Option<i64>, Vec<i64>)>,
    column: Option<String>,
    error: Option<String>,
    reattaches: u64,
}

async fn run(client: &ConnectClient, root: Vec<u8>) -> Outcome {
    let request = ExecutePlanRequest {
        session_id: SESSION.into(),
        user_context: Some(UserContext::new("tether-client")),
        plan: Some(Plan::root(root)),
        ..Default::default()
    };
    let mut stream =
        ReattachingStream::new(Arc::new(client.clone()), request, ClientConfig::default())
            .expect("a valid request");
    let mut result = Outcome::default();
    while let Some(item) = stream.next().await {
        let response = match item {
            Ok(r) => r,
            Err(e) => {
                result.error = Some(e.to_string());
                break;
            }
        };
        if let Some(schema) = &response.schema {
            assert!(result.schema.is_none() && result.batches.is_empty());
            result.schema = Some(DataType::decode(&schema[..]).expect("a DataType"));
        }
        if let Some(ResponseType::ArrowBatch(batch)) = response.response_type {
            let mut reader = arrow::ipc::reader::StreamReader::try_new(&batch.data[..], None)
                .expect("an Arrow IPC stream");
            let schema = reader.schema();
            assert_eq!(schema.fields().len(), 1);
            result.column = Some(schema.field(0).name().clone());
            assert!(!schema.field(0).is_nullable());
            let record = reader.next().expect("one record batch").expect("valid");
            assert!(
                reader.next().is_none(),
                "exactly one record batch per response"
            );
            let values = record
                .column(0)
                .as_primitive::<Int64Type>()
                .values()
                .to_vec();
            result
                .batches
                .push((batch.row_count, batch.start_offset, values));
        }
    }
    result.reattaches = stream.stats().reattaches;
    let _ = stream.close().await;
    result
}

fn long_column(name: &str, metadata: Option<&str>) -> DataType {
    DataType {
        kind: Some(data_type::Kind::Struct(data_type::Struct {
            fields: vec![data_type::StructField {
                name: name.into(),
                data_type: Some(DataType::long()),
                nullable: false,
                metadata: metadata.map(str::to_owned),
            }],
            type_variation_reference: 0,
        })),
    }
}

/// Runs `examples/range_client` against `server` to its end; its stdout (the run must
/// succeed).
fn run_range_client(server: &Server) -> String {
    let run = Command::new(example_binary("range_client"))
        .arg(server.url())
        .stdin(Stdio::null())
        .output()
        .expect("the client runs");
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    assert!(
        run.status.success(),
        "range_client failed ({}): {stdout}{}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    stdout
}

/// The README's client (`examples/range_client.rs`, the README's block after
/// `<!-- example: range_client -->`, which must be that file without its `//!` docs) reads
/// `spark.range(1000000)` from the example server with every stream rotated after one
/// response: all rows, across reattaches, and the execution released (rx §6).
#[test]
fn the_readme_client_reads_a_million_rows_across_reattaches() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let marker = "<!-- example: range_client -->";
    let block = readme
        .split_once(marker)
        .and_then(|(_, after)| after.trim_start().strip_prefix("```rust\n"))
        .and_then(|body| body.split_once("\n```"))
        .map(|(code, _)| format!("{code}\n"))
        .unwrap_or_else(|| panic!("README.md has no ```rust block after {marker}"));
    let example = std::fs::read_to_string(repo().join("examples/range_client.rs")).unwrap();
    let example: String = example
        .lines()
        .skip_while(|l| l.starts_with("//!"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(
        block, example,
        "the README's client differs from examples/range_client.rs"
    );

    let server = Server::rotating(&[]);
    let stdout = run_range_client(&server);
    // "1000000 rows, N reattaches": 100 responses of 10 000 rows, one stream each.
    let (rows, reattaches) = stdout
        .trim()
        .strip_suffix(" reattaches")
        .and_then(|s| s.split_once(" rows, "))
        .unwrap_or_else(|| panic!("unexpected output {stdout:?}"));
    assert_eq!(rows, "1000000");
    let reattaches: u64 = reattaches.parse().unwrap();
    assert!(
        reattaches >= 99,
        "{reattaches} reattaches for 100 rotated streams"
    );
    let stats = server.wait_for_stats(Duration::from_secs(10), "the execution released", |s| {
        stat(s, "live_executions") == 0 && stat(s, "created") == 1 && stat(s, "released") == 1
    });
    println!("range_client: {rows} rows, {reattaches} reattaches; server {stats:?}");
}

/// `--events-log` on a file that refuses every write (`/dev/full`, as a full disk): the
/// server serves on, logs the failure once, counts every event it could not write in
/// `connect_server_events_unwritten_total` (not silently lost), says how many when it
/// stops, and a SIGTERM still stops it at once (the writer is a thread of its own).
#[test]
fn an_events_log_that_cannot_be_written_counts_what_it_loses() {
    let metrics_port = free_port();
    let metrics_addr = format!("127.0.0.1:{metrics_port}");
    let mut server =
        Server::rotating(&["--events-log", "/dev/full", "--metrics-addr", &metrics_addr]);
    run_range_client(&server);
    server.wait_for_stats(Duration::from_secs(10), "the execution released", |s| {
        stat(s, "released") == 1 && stat(s, "live_executions") == 0
    });
    // Each rotated stream is a StreamRotated and a Reattached event: about 200, and more.
    let unwritten = |m: &BTreeMap<String, f64>| {
        m.get("connect_server_events_unwritten_total")
            .copied()
            .unwrap_or(0.0) as u64
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let counted = loop {
        let n = unwritten(&scrape(metrics_port));
        if n >= 200 || Instant::now() > deadline {
            break n;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(counted >= 200, "{counted} events counted as unwritten");
    let dropped = scrape(metrics_port)
        .get("tether_events_dropped_total{side=\"connect\"}")
        .copied();
    assert!(
        dropped.unwrap_or(0.0) == 0.0,
        "a full channel dropped {dropped:?}"
    );
    assert_eq!(
        server.log_count("writing the events log failed"),
        1,
        "logged once per streak"
    );
    server.terminate();
    let status = server.wait_exit(Duration::from_secs(15));
    assert!(status.success(), "exit status {status}");
    let said = server
        .stdout_lines()
        .iter()
        .find_map(|l| {
            l.strip_prefix("events log: ")?
                .strip_suffix(" events could not be written")?
                .parse::<u64>()
                .ok()
        })
        .expect("the stop says how many events were not written");
    assert!(
        said >= counted,
        "{said} said at the stop, {counted} counted before"
    );
}

/// `--events-log` across a log rotation: the file is renamed, SIGHUP makes the server open
/// its path again, and each query's events are whole in one file or the other (the first
/// query's in the renamed file, the second's and the last line in the new one); nothing is
/// lost or written twice.
#[test]
fn an_events_log_is_opened_again_on_sighup_after_a_rotation() {
    let dir = std::env::temp_dir().join(format!(
        "tether-events-log-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let (path, rotated) = (dir.join("events.jsonl"), dir.join("events.jsonl.1"));
    let mut server = Server::rotating(&["--events-log", path.to_str().unwrap()]);
    let query = |released: u64| {
        run_range_client(&server);
        server.wait_for_stats(Duration::from_secs(10), "the execution released", |s| {
            stat(s, "released") == released && stat(s, "live_executions") == 0
        });
    };
    let lines_of = |file: &Path| -> Vec<serde_json::Value> {
        std::fs::read_to_string(file)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect()
    };
    let kinds = |lines: &[serde_json::Value], kind: &str| -> Vec<String> {
        lines
            .iter()
            .filter(|l| l["kind"] == kind)
            .map(|l| l["operation_id"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    let wait_for = |what: &str, ok: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ok() {
            assert!(Instant::now() < deadline, "{what}: not within 10 s");
            std::thread::sleep(Duration::from_millis(20));
        }
    };

    query(1);
    wait_for("the first query's OperationClosed written", &|| {
        kinds(&lines_of(&path), "OperationClosed").len() == 1
    });
    std::fs::rename(&path, &rotated).unwrap();
    server.signal("HUP");
    wait_for("the events log opened again", &|| {
        server.log_count("events log opened again") == 1
    });
    query(2);
    server.terminate();
    assert!(server.wait_exit(Duration::from_secs(15)).success());

    let (old, new) = (lines_of(&rotated), lines_of(&path));
    let (first, second) = (
        kinds(&old, "OperationStarted"),
        kinds(&new, "OperationStarted"),
    );
    assert_eq!(
        first.len(),
        1,
        "the first query started in the renamed file"
    );
    assert_eq!(second.len(), 1, "the second query started in the new file");
    assert_ne!(first, second, "two operations");
    assert_eq!(
        kinds(&old, "OperationClosed"),
        first,
        "closed where it started"
    );
    assert_eq!(
        kinds(&new, "OperationClosed"),
        second,
        "closed where it started"
    );
    assert!(
        kinds(&old, "Dropped").is_empty(),
        "the last line is not in the renamed file"
    );
    let last = new.last().expect("the new file has lines");
    assert_eq!(
        (
            last["kind"].as_str(),
            last["count"].as_u64(),
            last["unwritten"].as_u64()
        ),
        (Some("Dropped"), Some(0), Some(0)),
        "the last line, in the new file: nothing dropped or unwritten"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tether_client_reads_ranges_limits_and_counts_as_spark_sends_them() {
    let server = tokio::task::spawn_blocking(|| Server::rotating(&[]))
        .await
        .unwrap();
    let client = ConnectClient::connect(&server.url(), None).await.unwrap();

    // spark.range(200000): 2 partitions of 100 000, batches of 10 000 (Spark 4.3.0,
    // local[2]), every row once and in order, across a rotated stream per response.
    let r = run(&client, range_rel(ROWS).encode_to_vec()).await;
    assert_eq!(r.error, None);
    assert_eq!(r.schema, Some(long_column("id", None)));
    assert_eq!(r.column.as_deref(), Some("id"));
    assert_eq!(r.batches.len(), 20);
    let mut next = 0;
    for (row_count, start_offset, values) in &r.batches {
        assert_eq!(*row_count, 10_000);
        assert_eq!(*start_offset, Some(next));
        assert_eq!(values, &(next..next + 10_000).collect::<Vec<_>>());
        next += 10_000;
    }
    assert!(r.reattaches >= 20, "{} reattaches", r.reattaches);

    // limit(25000) over range(30000): one partition (CollectLimit), 10 000 per batch.
    let r = run(
        &client,
        Relation::limit(range_rel(30_000), 25_000).encode_to_vec(),
    )
    .await;
    let sizes: Vec<i64> = r.batches.iter().map(|b| b.0).collect();
    assert_eq!(sizes, vec![10_000, 10_000, 5_000]);
    let values: Vec<i64> = r.batches.iter().flat_map(|b| b.2.clone()).collect();
    assert_eq!(values, (0..25_000).collect::<Vec<_>>());

    // count(): one row in a column named `count(1)`.
    let count = Relation::count(Relation::limit(range_rel(ROWS), 12_345));
    let r = run(&client, count.encode_to_vec()).await;
    let auto = Some(r#"{"__autoGeneratedAlias":"true"}"#);
    assert_eq!(r.schema, Some(long_column("count(1)", auto)));
    assert_eq!(r.column.as_deref(), Some("count(1)"));
    assert_eq!(r.batches, vec![(1, Some(0), vec![12_345])]);

    // An empty result is one batch of 0 rows.
    let r = run(&client, range_rel(0).encode_to_vec()).await;
    assert_eq!(r.batches, vec![(0, Some(0), vec![])]);

    // A relation it does not run (`project`, field 3): Spark-style error, not a hang.
    let r = run(&client, vec![0x1a, 0x00]).await;
    let error = r.error.expect("an unsupported plan fails");
    assert!(
        error.contains("[CONNECT_INVALID_PLAN.INVALID_ONE_OF_FIELD_NOT_SUPPORTED]")
            && error.contains("PROJECT(3)"),
        "{error}"
    );

    // AnalyzePlan schema.
    let analyzed = client
        .analyze_plan(AnalyzePlanRequest {
            session_id: SESSION.into(),
            user_context: Some(UserContext::new("tether-client")),
            analyze: Some(analyze_plan_request::Analyze::Schema(
                analyze_plan_request::Schema {
                    plan: Some(Plan::root(count.encode_to_vec())),
                },
            )),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        analyzed.result,
        Some(analyze_plan_response::Result::Schema(
            analyze_plan_response::Schema {
                schema: Some(long_column("count(1)", auto))
            }
        ))
    );

    let stats = tokio::task::spawn_blocking(move || {
        let s = server.wait_for_stats(Duration::from_secs(10), "every execution released", |s| {
            stat(s, "created") >= 5 && stat(s, "live_executions") == 0
        });
        (s, server)
    })
    .await
    .unwrap()
    .0;
    assert_eq!(stat(&stats, "released"), stat(&stats, "created"));
}

/// tether's client against `--faults`: every way a stream can end early (gracefully,
/// `DISCONNECTED`, a dropped connection, a forgotten operation) is recovered from, and
/// every run reads every row once and in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tether_client_recovers_from_every_fault() {
    let server = tokio::task::spawn_blocking(|| Server::rotating(&["--faults", "7"]))
        .await
        .unwrap();
    let client = ConnectClient::connect(&server.url(), None).await.unwrap();
    for run_number in 0..40 {
        let r = run(&client, range_rel(100_000).encode_to_vec()).await;
        assert_eq!(r.error, None, "run {run_number}");
        let values: Vec<i64> = r.batches.iter().flat_map(|b| b.2.clone()).collect();
        assert_eq!(values, (0..100_000).collect::<Vec<_>>(), "run {run_number}");
    }
    let stats = tokio::task::spawn_blocking(move || {
        server.wait_for_stats(Duration::from_secs(10), "every execution released", |s| {
            stat(s, "live_executions") == 0 && stat(s, "created") >= 40
        })
    })
    .await
    .unwrap();
    assert!(stat(&stats, "faults") >= 10, "{stats:?}");
    assert!(
        stat(&stats, "fault_dropped") + stat(&stats, "fault_forgotten") >= 1,
        "a connection was dropped: {stats:?}"
    );
    assert_eq!(
        stat(&stats, "released") + stat(&stats, "forgotten"),
        stat(&stats, "created"),
        "{stats:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// PySpark
// ---------------------------------------------------------------------------------------------

/// The interpreter of `target/pyspark-venv` (or `TETHER_PYSPARK_PYTHON`); `None` after a
/// loud SKIPPED message when there is none.
///
/// # Panics
/// Under `CI=true` instead of returning `None`.
pub(crate) fn pyspark_python(test: &str) -> Option<PathBuf> {
    let python = match std::env::var_os("TETHER_PYSPARK_PYTHON") {
        Some(path) => repo().join(path),
        None => repo().join("target/pyspark-venv/bin/python"),
    };
    if python.exists() {
        return Some(python);
    }
    skipped(
        test,
        &format!("no pyspark-client venv at {}", python.display()),
    )
}

pub(crate) fn skipped<T>(test: &str, why: &str) -> Option<T> {
    let why = format!(
        "the PySpark client cannot run: {why}. Run scripts/test.sh (or `bash \
         scripts/pyspark-env.sh` once) to set up target/pyspark-venv"
    );
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("FAILED (CI=true, no skipping): {test}: {why}");
    }
    // Straight to the process's stderr, past the test harness's capture, so it is seen.
    let _ = writeln!(std::io::stderr(), "\n!!!!! SKIPPED: {test}: {why} !!!!!\n");
    None
}

/// Exit status of `pyspark_checks.py` when pyspark-client cannot be imported.
const PY_ENV_ERROR: i32 = 3;

/// `pyspark_checks.py` running, its stdout lines arriving on a channel.
pub(crate) struct Checks {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stderr: Arc<Mutex<String>>,
}

impl Checks {
    /// `tests/python/pyspark_checks.py ARGS`.
    pub(crate) fn start(python: &Path, args: &[&str]) -> Self {
        Self::script(python, "pyspark_checks.py", args)
    }

    /// `tests/python/SCRIPT ARGS`.
    fn script(python: &Path, script: &str, args: &[&str]) -> Self {
        Self::script_with_env(python, script, args, &[])
    }

    /// `tests/python/SCRIPT ARGS` with the environment variables `env` set.
    pub(crate) fn script_with_env(
        python: &Path,
        script: &str,
        args: &[&str],
        env: &[(&str, &Path)],
    ) -> Self {
        let mut child = Command::new(python)
            .arg(repo().join("tests/python").join(script))
            .args(args)
            .envs(env.iter().copied())
            .env_remove("SPARK_CONNECT_AUTHENTICATE_TOKEN")
            .env_remove("SPARK_REMOTE")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("PYTHONIOENCODING", "utf-8")
            .current_dir(repo())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the venv's python starts");
        let (tx, lines) = mpsc::channel();
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut pipe = child.stderr.take().expect("piped stderr");
        let sink = stderr.clone();
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            sink.lock().unwrap().push_str(&text);
        });
        Self {
            stdin: child.stdin.take(),
            child,
            lines,
            stderr,
        }
    }

    /// The next stdout line starting with `prefix`, within `within`; `None` when the script
    /// could not import pyspark (exit status 3). Panics with its stderr when it fails.
    pub(crate) fn expect_line(&mut self, prefix: &str, within: Duration) -> Option<String> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return Some(line),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    panic!(
                        "no `{prefix}` line from the Python script within {within:?}:\n{}",
                        self.stderr.lock().unwrap()
                    )
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let status = self.wait(Duration::from_secs(10));
                    if status == Some(PY_ENV_ERROR) {
                        return None;
                    }
                    panic!(
                        "the Python script ended (status {status:?}) before `{prefix}`:\n{}",
                        self.stderr.lock().unwrap()
                    );
                }
            }
        }
    }

    pub(crate) fn wait(&mut self, within: Duration) -> Option<i32> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status.code();
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("the Python script did not exit within {within:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(crate) fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
}

impl Drop for Checks {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn pyspark_reads_every_row_once_in_order_across_rotated_streams_with_faults() {
    let test = "pyspark_reads_every_row_once_in_order_across_rotated_streams_with_faults";
    let Some(python) = pyspark_python(test) else {
        return;
    };
    // A stream per response (123 bytes), a detached execution abandoned after 5 s, and
    // seeded faults: up to 10 % of the streams cut gracefully, with DISCONNECTED, by a
    // dropped connection, or (an ExecutePlan) by forgetting the operation.
    let events_log = std::env::temp_dir().join(format!(
        "tether-events-{}-{}.jsonl",
        std::process::id(),
        ROWS
    ));
    let _ = std::fs::remove_file(&events_log);
    let metrics_port = free_port();
    let metrics_addr = format!("127.0.0.1:{metrics_port}");
    let server = Server::rotating(&[
        "--detached-timeout-ms",
        "5000",
        "--maintenance-interval-ms",
        "100",
        "--faults",
        "20261201",
        "--events-log",
        events_log.to_str().expect("a UTF-8 temp path"),
        "--metrics-addr",
        &metrics_addr,
    ]);
    let mut checks = Checks::start(&python, &["data", &server.port.to_string()]);
    let Some(ready) = checks.expect_line("READY ", Duration::from_secs(150)) else {
        skipped::<()>(test, &checks.stderr());
        return;
    };
    let report: serde_json::Value = serde_json::from_str(&ready["READY ".len()..]).unwrap();
    let executions = report["executions"]
        .as_u64()
        .expect("the script's execution count");
    eprintln!("pyspark_checks.py: {report}");

    // Every execution the client started was released (ReleaseAll is asynchronous), but
    // the ones the faults forgot, which the client started again.
    let stats = server.wait_for_stats(Duration::from_secs(10), "every execution released", |s| {
        stat(s, "created") >= executions && stat(s, "live_executions") == 0
    });
    assert_eq!(
        stat(&stats, "released") + stat(&stats, "forgotten"),
        stat(&stats, "created"),
        "{stats:?}"
    );
    assert_eq!(stat(&stats, "abandoned"), 0, "{stats:?}");
    let reattaches = server.message_count("ReattachExecute");
    assert!(
        reattaches >= 60,
        "rotation after every response: {reattaches} reattaches"
    );
    // The faults happened, and the client recovered from each (every row above arrived
    // once and in order). A forgotten operation was executed again under its id.
    assert!(stat(&stats, "faults") >= 10, "{stats:?}");
    assert!(stat(&stats, "fault_forgotten") >= 1, "{stats:?}");
    assert_eq!(
        stat(&stats, "fault_forgotten"),
        stat(&stats, "forgotten"),
        "{stats:?}"
    );
    let log = server.log.lock().unwrap().clone();
    for line in log.lines().filter(|l| l.contains("fault=Forget")) {
        let op = line
            .split("operation_id=")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .expect("the forgotten operation id");
        let executes = log
            .lines()
            .filter(|l| {
                is_message(l, "ExecutePlan")
                    && !is_message(l, "ExecutePlan refused")
                    && l.contains(op)
            })
            .count();
        assert_eq!(executes, 2, "{op}: executed, forgotten, executed again");
    }

    // The script ends without spark.stop(): what its exit hooks start but cannot release
    // (PySpark's ML cache clean-up command, refused here) is abandoned once detached for
    // the detached timeout, so nothing outlives it.
    checks
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"exit\n")
        .unwrap();
    let status = checks.wait(Duration::from_secs(30));
    assert_eq!(status, Some(0), "pyspark_checks.py:\n{}", checks.stderr());
    let stats = server.wait_for_stats(
        Duration::from_secs(20),
        "everything released or abandoned after the client exited",
        |s| {
            stat(s, "live_executions") == 0
                && stat(s, "released") + stat(s, "abandoned") + stat(s, "forgotten")
                    == stat(s, "created")
                && stat(s, "created") >= executions
        },
    );
    eprintln!("server after the client exited: {stats:?}, {reattaches} reattaches");

    // What the listener saw: Spark's order for every operation, one Closed each; and the
    // scraped metrics equal to the events and to the stats line.
    let events = wait_for_events(&events_log, stats["created"]);
    let _ = std::fs::remove_file(&events_log);
    let count = |kind: &str| events.iter().filter(|e| e["kind"] == kind).count() as f64;
    check_operation_order(&events);
    // The counters reach the recorder at each maintenance pass (every 100 ms here).
    let deadline = Instant::now() + Duration::from_secs(10);
    let metrics = loop {
        let metrics = scrape(metrics_port);
        let closed = metrics
            .iter()
            .filter(|(k, _)| k.starts_with("tether_connect_executions_closed_total"))
            .map(|(_, v)| v)
            .sum::<f64>();
        if closed == count("OperationClosed") || Instant::now() > deadline {
            break metrics;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let m = |name: &str| metrics.get(name).copied().unwrap_or(0.0);
    eprintln!("events: {} lines; metrics: {metrics:?}", events.len());
    let created = stat(&stats, "created") as f64;
    assert_eq!(m("tether_connect_executions_started_total"), created);
    assert_eq!(count("OperationStarted"), created);
    assert_eq!(
        count("OperationClosed"),
        created,
        "one Closed per execution"
    );
    assert_eq!(
        m(r#"tether_connect_executions_closed_total{removal="released"}"#),
        (stat(&stats, "released") + stat(&stats, "forgotten")) as f64
    );
    assert_eq!(
        m(r#"tether_connect_executions_closed_total{removal="abandoned"}"#),
        stat(&stats, "abandoned") as f64
    );
    assert_eq!(count("Abandoned"), stat(&stats, "abandoned") as f64);
    assert_eq!(m("tether_connect_executions"), 0.0);
    assert_eq!(m("tether_connect_attached_streams"), 0.0);
    assert_eq!(m("tether_connect_reattaches_total"), count("Reattached"));
    assert!(count("Reattached") >= 60.0, "rotation after every response");
    let rotations = m(r#"tether_connect_stream_rotations_total{reason="bytes"}"#)
        + m(r#"tether_connect_stream_rotations_total{reason="duration"}"#);
    assert_eq!(rotations, count("StreamRotated"));
    assert_eq!(
        m(r#"tether_connect_executions_ended_total{status="finished"}"#),
        count("OperationFinished")
    );
    assert_eq!(
        m(r#"tether_connect_executions_ended_total{status="failed"}"#),
        count("OperationFailed")
    );
    assert_eq!(
        m(r#"tether_connect_executions_ended_total{status="canceled"}"#),
        count("OperationCanceled")
    );
    assert_eq!(
        m("tether_connect_sessions_started_total"),
        count("SessionStarted")
    );
    assert_eq!(
        m(r#"tether_connect_releases_total{kind="all"}"#),
        events
            .iter()
            .filter(|e| e["kind"] == "Released" && e["fields"]["until"].is_null())
            .count() as f64
    );
    assert_eq!(m(r#"tether_events_dropped_total{side="connect"}"#), 0.0);
}

/// A port nobody listens on now (bound and released), for a server's second listener.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("an ephemeral port")
        .port()
}

/// The server's `--events-log` once it holds `closed` `OperationClosed` events (the log is
/// written by the server's own task, a little after the stats line).
pub(crate) fn wait_for_events(path: &Path, closed: u64) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let events: Vec<serde_json::Value> = std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("one JSON event per line"))
            .collect();
        let seen = events
            .iter()
            .filter(|e| e["kind"] == "OperationClosed")
            .count() as u64;
        if seen >= closed {
            return events;
        }
        assert!(
            Instant::now() < deadline,
            "{seen} of {closed} OperationClosed events in {}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every operation's events follow Spark's status machine (rx §2.1 item 4): each status
/// event allowed after the one before, tether's own events only while it is open, one
/// `OperationClosed` per execution (an operation the faults forgot runs again under its id
/// and closes twice).
fn check_operation_order(events: &[serde_json::Value]) {
    use tether::execution::OperationStatus as S;
    let mut ops: BTreeMap<String, S> = BTreeMap::new();
    for e in events {
        let Some(op) = e["operation_id"].as_str() else {
            continue;
        };
        let next = match e["kind"].as_str().expect("a kind") {
            "OperationStarted" => S::Started,
            "OperationAnalyzed" => S::Analyzed,
            "OperationReadyForExecution" => S::ReadyForExecution,
            "OperationFinished" => S::Finished,
            "OperationFailed" => S::Failed,
            "OperationCanceled" => S::Canceled,
            "OperationClosed" => S::Closed,
            "TombstoneHit" => continue,
            other => {
                let now = ops.get(op).copied().unwrap_or(S::Pending);
                assert!(
                    !matches!(now, S::Pending | S::Closed),
                    "{other} of {op} outside its life"
                );
                continue;
            }
        };
        let from = match ops.get(op).copied().unwrap_or(S::Pending) {
            S::Closed => S::Pending,
            s => s,
        };
        assert!(from.allows(next), "{op}: {next:?} after {from:?}");
        ops.insert(op.to_owned(), next);
    }
    for (op, status) in ops {
        assert_eq!(status, S::Closed, "{op} was never closed");
    }
}

/// The Prometheus text at `http://127.0.0.1:PORT/metrics`: each sample by its name and
/// labels as written (`name{label="v"}`), summed over nothing.
fn scrape(port: u16) -> BTreeMap<String, f64> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("the metrics port");
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).unwrap();
    let (head, text) = body.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(
        head.starts_with("HTTP/1.") && head.contains(" 200 "),
        "{head}"
    );
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// Runs `connect_scenarios.py MODE PORT ARGS` to its `done` line; returns its `CASE` lines.
pub(crate) fn scenarios(
    python: &Path,
    test: &str,
    args: &[&str],
    done: &str,
) -> Option<Vec<String>> {
    let mut run = Checks::script(python, "connect_scenarios.py", args);
    let mut cases = Vec::new();
    loop {
        let line = run.expect_line("", Duration::from_secs(120));
        let Some(line) = line else {
            return skipped(test, &run.stderr());
        };
        if line == done {
            break;
        }
        if let Some(case) = line.strip_prefix("CASE ") {
            eprintln!("{}: {case}", args[0]);
            cases.push(case.to_owned());
        }
    }
    let status = run.wait(Duration::from_secs(30));
    assert_eq!(status, Some(0), "connect_scenarios.py:\n{}", run.stderr());
    Some(cases)
}

#[test]
fn pyspark_sees_spark_errors_and_users_are_isolated() {
    let test = "pyspark_sees_spark_errors_and_users_are_isolated";
    let Some(python) = pyspark_python(test) else {
        return;
    };
    let server = Server::rotating(&[]);
    let port = server.port.to_string();
    // The script asserts each case's condition, SQLSTATE, parameters and the exception
    // class PySpark raises; here, that every case ran.
    let Some(errors) = scenarios(&python, test, &["errors", &port], "ERRORS DONE") else {
        return;
    };
    assert_eq!(errors.len(), 16, "{errors:#?}");
    // Each error the client was answered is in the server's log with its condition, as
    // Spark's `ErrorUtils.handleError` logs them, and at INFO: each case is the client's
    // (a refusal with a Spark condition, or an execution's error on its stream), never an
    // ERROR an operator would be paged for.
    for case in &errors {
        let case: serde_json::Value = serde_json::from_str(case).unwrap();
        let Some(condition) = case["condition"].as_str() else {
            continue;
        };
        let field = format!("condition=\"{condition}\"");
        let logged = server.log_lines_with(&[" INFO ", "Spark Connect RPC error", &field])
            + server.log_lines_with(&[
                " INFO ",
                "Spark Connect error on a response stream",
                &field,
            ]);
        assert!(logged >= 1, "{case}: not logged with its condition");
        assert_eq!(
            server.log_lines_with(&[" ERROR ", &field]),
            0,
            "{case}: a client's error logged at ERROR"
        );
    }
    // Every execution of the error cases was released by its client before its
    // ReleaseSession (the raw stub's RPCs are synchronous): none was abandoned.
    let after_errors = server.wait_for_stats(Duration::from_secs(10), "errors released", |s| {
        stat(s, "live_executions") == 0
    });
    assert_eq!(stat(&after_errors, "abandoned"), 0, "{after_errors:?}");
    let Some(isolation) = scenarios(&python, test, &["isolation", &port], "ISOLATION OK") else {
        return;
    };
    assert_eq!(isolation.len(), 4, "{isolation:#?}");
    // Where tether deliberately differs from Spark (the table in `tether::spark::connect`;
    // scripts/real-spark.sh holds Spark to its side): each case succeeds here.
    let Some(differences) = scenarios(&python, test, &["differences", &port], "DIFFERENCES DONE")
    else {
        return;
    };
    assert_eq!(differences.len(), 3, "{differences:#?}");
    for case in &differences {
        let case: serde_json::Value = serde_json::from_str(case).unwrap();
        assert_eq!(case["code"], "OK", "{case}");
        assert_eq!(case["result"], true, "{case}");
    }
    // User B's release and interrupts touched nothing of user A's: A read every row (checked
    // by the script), B's ReleaseAll found nothing (B's session has no such operation, rx
    // §5.6) and B's interrupts hit nothing (below).
    let stats = server.wait_for_stats(Duration::from_secs(10), "every execution released", |s| {
        stat(s, "live_executions") == 0
    });
    // The RPC's span names the user; the handler's DEBUG line says what the release found.
    let b_release = [
        "rpc=\"ReleaseExecute\" user_id=tether-user-b",
        "ReleaseExecute release=",
    ];
    assert_eq!(
        server.log_lines_with(&b_release),
        1,
        "B sent one ReleaseExecute"
    );
    assert_eq!(
        server.log_lines_with(&[b_release[0], b_release[1], "found=true"]),
        0,
        "B's release must not find A's execution"
    );
    // A's own end: PySpark sends its ReleaseAll from a background thread and `spark.stop()`
    // sends ReleaseSession without waiting for it, so on a loaded machine the ReleaseSession
    // may arrive first and close A's session with the execution still in it (counted as
    // abandoned, rx §5.6). Nothing else may be abandoned.
    assert!(stat(&stats, "abandoned") <= 1, "{stats:?}");
    // Only the differences case interrupted anything (its own execution): user B's
    // interrupts hit nothing.
    assert_eq!(server.log_count("interrupted=1"), 1, "one interrupt hit");
}

/// The artifact cases of `connect_scenarios.py` (raw gRPC; `scripts/real_spark.py` compares
/// them with Spark 4.3.0) and PySpark's own uploads: every case answered as Spark answers it
/// or as the table of differences documents it, and every byte freed with its session.
#[test]
fn artifacts_are_checked_kept_and_freed_with_their_session() {
    let test = "artifacts_are_checked_kept_and_freed_with_their_session";
    let Some(python) = pyspark_python(test) else {
        return;
    };
    let server = Server::start(&[]);
    let port = server.port.to_string();
    // The script asserts each case (summaries, statuses, conditions, SQLSTATEs).
    let Some(cases) = scenarios(&python, test, &["artifacts", &port], "ARTIFACTS DONE") else {
        return;
    };
    assert_eq!(cases.len(), 24, "{cases:#?}");
    let Some(differences) = scenarios(
        &python,
        test,
        &["artifact-differences", &port],
        "ARTIFACT DIFFERENCES DONE",
    ) else {
        return;
    };
    assert_eq!(differences.len(), 12, "{differences:#?}");
    for case in &differences {
        let case: serde_json::Value = serde_json::from_str(case).unwrap();
        let name = case["case"].as_str().unwrap();
        let condition = case["condition"].as_str();
        let want =
            if name.starts_with("artifact_name ") || name.ends_with("bad_name_after_a_good_one") {
                Some("INVALID_ARTIFACT_PATH")
            } else if name == "artifact_wrong_hash" {
                Some("ARTIFACT_HASH_MISMATCH")
            } else if name == "artifact_refused_request" {
                Some("ARTIFACT_ALREADY_EXISTS")
            } else {
                None
            };
        assert_eq!(case["code"], "INTERNAL", "{case}");
        assert_eq!(condition, want, "{case}");
        // Nothing of a refused stream is kept.
        assert_ne!(case["first_kept"], true, "{case}");
    }
    // Both sessions were released: nothing is held.
    server.wait_for_stats(Duration::from_secs(10), "artifacts freed", |s| {
        stat(s, "artifact_bytes") == 0
    });

    // PySpark's uploads: a file (76 804 bytes) and a cached local relation.
    let mut run = Checks::script(
        &python,
        "connect_scenarios.py",
        &["artifacts-pyspark", &port],
    );
    let mut pyspark = Vec::new();
    loop {
        let Some(line) = run.expect_line("", Duration::from_secs(120)) else {
            return skipped(test, &run.stderr()).unwrap_or(());
        };
        if line == "HOLDING" {
            break;
        }
        if let Some(case) = line.strip_prefix("CASE ") {
            pyspark.push(case.to_owned());
        }
    }
    assert_eq!(pyspark.len(), 4, "{pyspark:#?}");
    let holding = server.wait_for_stats(Duration::from_secs(10), "the uploads held", |s| {
        stat(s, "artifact_bytes") > 76_804
    });
    eprintln!("held by the PySpark session: {holding:?}");
    run.stdin.take().expect("stdin").write_all(b"\n").unwrap();
    assert!(
        run.expect_line("ARTIFACTS PYSPARK DONE", Duration::from_secs(60))
            .is_some()
    );
    assert_eq!(
        run.wait(Duration::from_secs(30)),
        Some(0),
        "{}",
        run.stderr()
    );
    // spark.stop() released the session, and its artifacts with it.
    server.wait_for_stats(Duration::from_secs(10), "freed with the session", |s| {
        stat(s, "artifact_bytes") == 0
    });

    // Limits: refused before anything is buffered, nothing of the refused upload kept.
    let metrics_port = free_port();
    let metrics_addr = format!("127.0.0.1:{metrics_port}");
    let limited = Server::start(&[
        "--artifact-session-bytes",
        "100000",
        "--metrics-addr",
        &metrics_addr,
        "--maintenance-interval-ms",
        "100",
    ]);
    let limited_port = limited.port.to_string();
    let Some(limits) = scenarios(
        &python,
        test,
        &["artifact-limits", &limited_port, "100000"],
        "ARTIFACT LIMITS DONE",
    ) else {
        return;
    };
    assert_eq!(limits.len(), 5, "{limits:#?}");
    limited.wait_for_stats(Duration::from_secs(10), "freed with the session", |s| {
        stat(s, "artifact_bytes") == 0
    });
    // The refusals are counted by reason, and published with the kept bytes (0 now) on
    // the maintenance interval.
    let refused = "tether_connect_artifact_uploads_refused_total{reason=\"limit\"}";
    let deadline = Instant::now() + Duration::from_secs(10);
    let metrics = loop {
        let metrics = scrape(metrics_port);
        if metrics.get(refused) == Some(&3.0) || Instant::now() > deadline {
            break metrics;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(metrics.get(refused), Some(&3.0), "{metrics:#?}");
    assert_eq!(
        metrics.get("tether_connect_artifact_bytes"),
        Some(&0.0),
        "{metrics:#?}"
    );
}

/// connect §14, §15: CloneSession's and GetStatus's answers (the script asserts each case's
/// condition, SQLSTATE and parameters, the states of operations through their lives, never
/// back to running, and PySpark's `cloneSession()`: the source's configuration, then
/// independence); here, that every case ran and the refusals created no session.
#[test]
fn pyspark_clones_sessions_and_reads_operation_states() {
    let test = "pyspark_clones_sessions_and_reads_operation_states";
    let Some(python) = pyspark_python(test) else {
        return;
    };
    let server = Server::rotating(&[]);
    let port = server.port.to_string();
    let Some(cases) = scenarios(&python, test, &["sessions", &port], "SESSIONS DONE") else {
        return;
    };
    assert_eq!(cases.len(), 28, "{cases:#?}");
    // Each CloneSession and GetStatus was served (no UNIMPLEMENTED), in its RPC's span.
    assert!(server.log_lines_with(&["rpc=\"CloneSession\"", "CloneSession new_session_id="]) >= 4);
    assert!(server.log_lines_with(&["rpc=\"GetStatus\"", "GetStatus operations="]) >= 10);
    // Everything was released at the end: the script's own sessions and PySpark's.
    let stats = server.wait_for_stats(Duration::from_secs(10), "sessions released", |s| {
        stat(s, "live_executions") == 0
    });
    assert_eq!(stat(&stats, "abandoned"), 0, "{stats:?}");
}

#[test]
fn pyspark_killed_client_leaves_an_execution_that_is_abandoned() {
    let test = "pyspark_killed_client_leaves_an_execution_that_is_abandoned";
    let Some(python) = pyspark_python(test) else {
        return;
    };
    let server = Server::rotating(&[
        "--detached-timeout-ms",
        "1500",
        "--maintenance-interval-ms",
        "100",
    ]);
    let port = server.port.to_string();
    let session = "5e55a0e5-0000-4000-8000-0000000ab0de";
    let operation = "0be7a7e0-0000-4000-8000-0000000ab0de";
    let mut client = Checks::script(
        &python,
        "connect_scenarios.py",
        &["abandon-start", &port, session, operation],
    );
    if client
        .expect_line("STARTED", Duration::from_secs(60))
        .is_none()
    {
        skipped::<()>(test, &client.stderr());
        return;
    }
    // Killed mid-query: no release, no goodbye.
    client.child.kill().expect("SIGKILL");
    let _ = client.child.wait();
    let stats = server.wait_for_stats(
        Duration::from_secs(20),
        "the orphaned execution abandoned",
        |s| stat(s, "abandoned") == 1 && stat(s, "live_executions") == 0,
    );
    assert_eq!(stat(&stats, "created"), 1, "{stats:?}");
    // A reattach, and the same ExecutePlan again, get OPERATION_ABANDONED (asserted by the
    // script).
    let Some(cases) = scenarios(
        &python,
        test,
        &["abandon-check", &port, session, operation],
        "ABANDON DONE",
    ) else {
        return;
    };
    assert_eq!(cases.len(), 2, "{cases:#?}");
}

/// A rolling restart without a proxy, at its worst: PySpark reads `range(5000000)` slowly
/// (about 10 000 rows a second, Spark's default stream limits) when the server gets
/// SIGTERM with a 1 s drain deadline. At the deadline the read fails with
/// `OPERATION_CANCELED` at once (not after the megabytes still unsent), `spark.stop()`
/// returns at once (its ReleaseSession reaches the server, whose drain waits for it), and
/// the server reports the cancel and exits 0.
#[test]
fn pyspark_is_told_at_a_drain_deadline_and_stops_at_once() {
    told_at_a_drain_deadline(
        "pyspark_is_told_at_a_drain_deadline_and_stops_at_once",
        5_000_000,
    );
}

fn told_at_a_drain_deadline(test: &str, total: u64) {
    let Some(python) = pyspark_python(test) else {
        return;
    };
    let server = Server::start(&["--drain-timeout-ms", "1000"]);
    drained_while_reading(test, &python, server, total, None);
}

/// PySpark reads `range(total)` slowly from `server` (over TLS with the token when `tls`
/// gives the token and the CA file); SIGTERM with a 1 s drain deadline: PySpark is told
/// `OPERATION_CANCELED` within seconds, `spark.stop()` returns at once, and the server
/// reports one canceled execution and exits 0.
pub(crate) fn drained_while_reading(
    test: &str,
    python: &Path,
    mut server: Server,
    total: u64,
    tls: Option<(&str, &Path)>,
) {
    let port = server.port.to_string();
    let total_arg = total.to_string();
    let mut args = vec!["drain-read", &port, &total_arg];
    let mut env = Vec::new();
    if let Some((token, roots)) = tls {
        args.push(token);
        env.push(("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", roots));
    }
    let mut client = Checks::script_with_env(python, "connect_scenarios.py", &args, &env);
    if client
        .expect_line("STARTED", Duration::from_secs(60))
        .is_none()
    {
        skipped::<()>(test, &client.stderr());
        return;
    }
    std::thread::sleep(Duration::from_millis(500));
    let terminated = Instant::now();
    server.terminate();
    let case = client
        .expect_line("CASE ", Duration::from_secs(30))
        .expect("the read's outcome");
    let told = terminated.elapsed();
    let case: serde_json::Value = serde_json::from_str(&case["CASE ".len()..]).unwrap();
    assert_eq!(case["condition"], "OPERATION_CANCELED", "{case}");
    // Deadline 1 s, then the error is the next thing the client reads: told well before the
    // rest could be read at this pace (30 s for 300 000 rows).
    assert!(told < Duration::from_secs(5), "told after {told:?}: {case}");
    let rows = case["rows"].as_u64().unwrap();
    assert!(
        rows < total / 2,
        "{rows} of {total} rows read before the cancel"
    );
    let stopped = client
        .expect_line("STOPPED ", Duration::from_secs(30))
        .expect("spark.stop() returns");
    let seconds: f64 = stopped["STOPPED ".len()..].parse().unwrap();
    assert!(seconds < 3.0, "spark.stop() took {seconds} s");
    assert_eq!(
        client.wait(Duration::from_secs(30)),
        Some(0),
        "{}",
        client.stderr()
    );
    let status = server.wait_exit(Duration::from_secs(30));
    let report = server.drain_report();
    assert!(
        report
            .starts_with("drained live_at_start=1 canceled=1 abandoned=0 left=0 sessions_open=0 "),
        "{report}"
    );
    assert!(status.success(), "exit status {status}; {report}");
    eprintln!("{report}; PySpark told after {told:?} having read {rows} rows; {stopped}");
}

#[test]
fn pyspark_needs_the_right_token() {
    let test = "pyspark_needs_the_right_token";
    let Some(python) = pyspark_python(test) else {
        return;
    };
    let token = "tether-s3cret";
    let server = Server::start(&["--token", token]);
    let mut checks = Checks::start(&python, &["auth", &server.port.to_string(), token]);
    if checks
        .expect_line("AUTH OK", Duration::from_secs(60))
        .is_none()
    {
        skipped::<()>(test, &checks.stderr());
        return;
    }
    let status = checks.wait(Duration::from_secs(30));
    assert_eq!(status, Some(0), "pyspark_checks.py:\n{}", checks.stderr());
    // Only the authenticated session ran anything.
    let stats = server.wait_for_stats(Duration::from_secs(10), "released", |s| {
        stat(s, "created") >= 2 && stat(s, "live_executions") == 0
    });
    assert_eq!(stat(&stats, "created"), 2, "{stats:?}");
    // The refused requests (no token, a wrong one) are logged at WARN with the peer's
    // address, never the token.
    let refused = server.log_lines_with(&[
        " WARN ",
        "Spark Connect request refused",
        "peer=\"127.0.0.1:",
    ]);
    assert!(refused >= 2, "{refused} refusals logged");
    assert_eq!(
        server.log_count("tether-s3cret"),
        0,
        "the token is never logged"
    );
}

/// An engine's error (the example engine's negative limit, a Spark condition with message
/// parameters) reaches PySpark with an `errorId`, and PySpark builds its exception from the
/// FetchErrorDetails answer (connect §8): the class, `getCondition()`,
/// `getMessageParameters()` and `getSqlState()` are those real Spark 4.3.0 gives PySpark for
/// `spark.range(10).limit(-1).collect()` (measured; scripts/real_spark.py compares the two
/// servers), the answer is the error's chain, a second fetch of the id and an unknown id
/// are answered empty.
#[test]
fn pyspark_builds_an_engine_error_from_fetch_error_details() {
    let test = "pyspark_builds_an_engine_error_from_fetch_error_details";
    let Some(python) = pyspark_python(test) else {
        return;
    };
    let server = Server::start(&[]);
    let mut checks = Checks::start(&python, &["error-details", &server.port.to_string()]);
    let Some(line) = checks.expect_line("ERROR-DETAILS ", Duration::from_secs(60)) else {
        skipped::<()>(test, &checks.stderr());
        return;
    };
    let status = checks.wait(Duration::from_secs(30));
    assert_eq!(status, Some(0), "pyspark_checks.py:\n{}", checks.stderr());
    let report: serde_json::Value =
        serde_json::from_str(line.trim_start_matches("ERROR-DETAILS ")).unwrap();
    // As Spark 4.3.0 answers PySpark (measured with the same script).
    assert_eq!(report["class"], "AnalysisException", "{report}");
    assert_eq!(
        report["condition"], "INVALID_LIMIT_LIKE_EXPRESSION.IS_NEGATIVE",
        "{report}"
    );
    assert_eq!(
        report["parameters"],
        serde_json::json!({"expr": "\"-1\"", "name": "limit", "v": "-1"}),
        "{report}"
    );
    assert_eq!(report["sql_state"], "42K0E", "{report}");
    assert_eq!(
        report["classes"],
        serde_json::json!([
            "org.apache.spark.sql.catalyst.ExtendedAnalysisException",
            "org.apache.spark.sql.AnalysisException",
            "java.lang.Exception",
            "java.lang.Throwable",
            "java.lang.Object"
        ]),
        "{report}"
    );
    assert_eq!(report["root_error_idx"], 0, "{report}");
    assert_eq!(report["errors"], 1, "{report}");
    assert_eq!(
        report["details_condition"], "INVALID_LIMIT_LIKE_EXPRESSION.IS_NEGATIVE",
        "{report}"
    );
    assert!(
        report["message"].as_str().unwrap().starts_with(
            "[INVALID_LIMIT_LIKE_EXPRESSION.IS_NEGATIVE] The limit like expression \"-1\" is \
             invalid. The limit expression must be equal to or greater than 0, but got -1. \
             SQLSTATE: 42K0E"
        ),
        "{report}"
    );
    assert_eq!(report["second_fetch_empty"], true, "{report}");
    assert_eq!(report["unknown_fetch_empty"], true, "{report}");
    // The server found each error PySpark asked about (the limit's, and any conf PySpark
    // read on its own that the server does not have), then answered nothing twice.
    let fetches = |found: &str| {
        server.log_lines_with(&["rpc=\"FetchErrorDetails\"", &format!("found={found}")])
    };
    assert_eq!(Some(fetches("true") as u64), report["fetched"].as_u64());
    assert_eq!(fetches("false"), 2);
}

/// `toPandas()` works (PySpark 4.2 reads `spark.sql.execution.pandas.structHandlingMode` and
/// `spark.sql.execution.arrow.pyspark.selfDestruct.enabled` first: the server's defaults,
/// docs/reference/spark-connect.md §12), and Config answers as Spark 4.3.0 does: a GetAll with
/// a prefix without the prefix, a key or value Spark's redaction pattern matches read as
/// absent by every Get, `spark.connect.authenticate.token` neither readable nor settable
/// (raw gRPC: `connect_scenarios.py config`, whose cases scripts/real_spark.py compares with
/// Spark 4.3.0's; and PySpark's `spark.conf`).
#[test]
fn pyspark_to_pandas_and_config_answers_as_spark() {
    let test = "pyspark_to_pandas_and_config_answers_as_spark";
    let Some(python) = pyspark_python(test) else {
        return;
    };
    let server = Server::start(&[]);
    let port = server.port.to_string();
    let Some(cases) = scenarios(&python, test, &["config", &port], "CONFIG DONE") else {
        return;
    };
    // The script asserts each answer; here, that every case ran.
    assert_eq!(cases.len(), 15, "{cases:#?}");
    let mut checks = Checks::start(&python, &["config", &port]);
    let Some(line) = checks.expect_line("CONFIG OK ", Duration::from_secs(60)) else {
        skipped::<()>(test, &checks.stderr());
        return;
    };
    let status = checks.wait(Duration::from_secs(30));
    assert_eq!(status, Some(0), "pyspark_checks.py:\n{}", checks.stderr());
    let report: serde_json::Value =
        serde_json::from_str(line.trim_start_matches("CONFIG OK ")).unwrap();
    assert_eq!(report["to_pandas"], 10, "{report}");
    assert_eq!(
        report["get_all"],
        serde_json::json!({"a": "1", "b": "2"}),
        "{report}"
    );
    assert_eq!(
        report["redacted"], "SparkNoSuchElementException",
        "{report}"
    );
    // PySpark found every conf it read: the only SQL_CONF_NOT_FOUND the server answered
    // were the scripts' own Gets (three raw, one through `spark.conf.get`).
    assert_eq!(
        server.log_lines_with(&[
            "Spark Connect RPC error",
            "condition=\"SQL_CONF_NOT_FOUND\""
        ]),
        4
    );
}

/// A server started with a token never hands it out through Config (connect §12): PySpark,
/// authenticated with it, can neither read nor set `spark.connect.authenticate.token`
/// (`CANNOT_MODIFY_STATIC_CONFIG`, as Spark 4.3.0), a value holding the token reads as
/// absent in Get, GetWithDefault and GetAll, and no Config answer or error PySpark saw
/// contains it; the server's log never does either.
#[test]
fn no_config_answer_carries_the_servers_token() {
    let test = "no_config_answer_carries_the_servers_token";
    let Some(python) = pyspark_python(test) else {
        return;
    };
    let token = "tether-c0nf-t0k";
    let server = Server::start(&["--token", token]);
    let mut checks = Checks::start(&python, &["config", &server.port.to_string(), token]);
    let Some(line) = checks.expect_line("CONFIG OK ", Duration::from_secs(60)) else {
        skipped::<()>(test, &checks.stderr());
        return;
    };
    let status = checks.wait(Duration::from_secs(30));
    assert_eq!(status, Some(0), "pyspark_checks.py:\n{}", checks.stderr());
    let report: serde_json::Value =
        serde_json::from_str(line.trim_start_matches("CONFIG OK ")).unwrap();
    assert_eq!(report["set_token"], "AnalysisException", "{report}");
    assert_eq!(report["to_pandas"], 10, "{report}");
    assert!(report["answers"].as_u64().unwrap() >= 8, "{report}");
    assert_eq!(server.log_count(token), 0, "the token is never logged");
}

/// `spark.sql(query)` (issue 33 item 9): the raw `Command { sql_command }` answered with one
/// `sql_command_result` carrying the input relation as sent, as Spark 4.3.0 answers a query
/// (`scripts/real_spark.py` compares the same cases with it), and PySpark's DataFrame then
/// plans that relation (the script asserts each case).
#[test]
fn pyspark_sql_is_answered_with_a_sql_command_result() {
    let test = "pyspark_sql_is_answered_with_a_sql_command_result";
    let Some(python) = pyspark_python(test) else {
        return;
    };
    let server = Server::start(&[]);
    let port = server.port.to_string();
    let Some(cases) = scenarios(&python, test, &["sql", &port], "SQL DONE") else {
        return;
    };
    assert_eq!(cases.len(), 3, "{cases:#?}");
}
