//! Results of any size (connect §10) and admission (connect §11) with real PySpark against
//! the test server: one Arrow batch of 200 MiB read exactly once in chunks (also across
//! rotated and broken streams), its clear error with chunking off, and ten clients against
//! a cap of three.
#![cfg(feature = "spark-connect")]

use std::path::PathBuf;

use crate::pyspark_connect::{Server, pyspark_python, scenarios, wait_for_events};

/// 200 MiB of `bigint` ids in one Arrow batch (26 214 400 rows × 8 bytes).
const ROWS_200_MIB: u64 = 200 * 1024 * 1024 / 8;

/// One batch per query: every row in one partition, one batch.
fn one_batch() -> Vec<String> {
    [
        "--max-records-per-batch",
        &ROWS_200_MIB.to_string(),
        "--default-parallelism",
        "1",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// PySpark's `range(ROWS_200_MIB).toArrow()` against a server with `server_args`: its
/// `CASE` and the server's last stats line.
fn chunked(
    test: &str,
    server_args: &[&str],
    allow: bool,
    preferred: Option<u64>,
) -> Option<(serde_json::Value, String)> {
    let python = pyspark_python(test)?;
    let args: Vec<String> = one_batch();
    let args: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .chain(server_args.iter().copied())
        .collect();
    let server = Server::start(&args);
    let port = server.port.to_string();
    let rows = ROWS_200_MIB.to_string();
    let preferred = preferred.map(|p| p.to_string());
    let mut run = vec!["chunked", &port, &rows, if allow { "1" } else { "0" }];
    if let Some(p) = &preferred {
        run.push(p);
    }
    let cases = scenarios(&python, test, &run, "CHUNKED DONE")?;
    assert_eq!(cases.len(), 1, "{cases:?}");
    let stats = server
        .stdout_lines()
        .into_iter()
        .rfind(|l| l.starts_with("stats "))
        .unwrap_or_default();
    Some((serde_json::from_str(&cases[0]).unwrap(), stats))
}

#[test]
fn pyspark_reads_a_200_mib_batch_in_chunks_exactly_once() {
    let Some(run) = chunked(
        "pyspark_reads_a_200_mib_batch_in_chunks_exactly_once",
        &[],
        true,
        None,
    ) else {
        return;
    };
    let (case, stats) = run;
    assert_eq!(case["rows"], ROWS_200_MIB, "{case}");
    assert_eq!(case["in_order"], true, "{case}");
    // One batch, in two chunks of at most 90 % of 128 MiB.
    assert_eq!(case["batches"], 1, "{case}");
    assert_eq!(case["most_chunks"], 2, "{case}");
    assert_eq!(case["responses"], 2, "{case}");
    assert!(stats.contains("live_executions="), "{stats}");
}

#[test]
fn pyspark_reads_chunks_across_rotated_and_broken_streams_exactly_once() {
    // 1 MiB chunks (the client's preference), a stream rotated after every 8 MB sent (about
    // 26 streams) and seeded faults ending some of them: the client reattaches mid-batch.
    let Some(run) = chunked(
        "pyspark_reads_chunks_across_rotated_and_broken_streams_exactly_once",
        &["--max-stream-bytes", "8000000", "--faults", "7"],
        true,
        Some(1 << 20),
    ) else {
        return;
    };
    let (case, stats) = run;
    assert_eq!(case["rows"], ROWS_200_MIB, "{case}");
    assert_eq!(case["in_order"], true, "{case}");
    assert_eq!(case["batches"], 1, "{case}");
    // 200 MiB of values plus the Arrow IPC stream's schema and framing: 201 chunks.
    assert_eq!(case["most_chunks"], 201, "{case}");
    assert_eq!(case["responses"], 201, "{case}");
    let faults = stats
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("faults="))
        .and_then(|n| n.parse::<u64>().ok());
    assert!(faults.is_some_and(|n| n > 0), "no stream broken: {stats}");
}

#[test]
fn pyspark_without_chunking_gets_a_clear_error_for_a_batch_too_large() {
    let Some(run) = chunked(
        "pyspark_without_chunking_gets_a_clear_error_for_a_batch_too_large",
        &[],
        false,
        None,
    ) else {
        return;
    };
    let (case, _) = run;
    assert_eq!(case["condition"], "ARROW_BATCH_TOO_LARGE", "{case}");
    let message = case["message"].as_str().unwrap();
    assert!(message.contains("ResultChunkingOptions"), "{case}");
}

/// Ten PySpark clients, each a query of about 1.5 s (five responses 0.3 s apart: the
/// schema and four batches), submitted 0.2 s apart against a cap of three running
/// executions: every client reads every row,
/// never more than three run at once, and they start in the order they were submitted.
#[test]
fn ten_clients_against_a_cap_of_three_all_finish_in_fifo_order() {
    let test = "ten_clients_against_a_cap_of_three_all_finish_in_fifo_order";
    let Some(python) = pyspark_python(test) else {
        return;
    };
    let dir = tempdir(test);
    let events = dir.join("events.jsonl");
    let server = Server::start(&[
        "--max-running",
        "3",
        "--response-delay-ms",
        "300",
        "--events-log",
        events.to_str().unwrap(),
    ]);
    let port = server.port.to_string();
    let Some(cases) = scenarios(
        &python,
        test,
        &["admission", &port, "10", "40000"],
        "ADMISSION DONE",
    ) else {
        return;
    };
    assert_eq!(cases.len(), 10);
    for case in &cases {
        let case: serde_json::Value = serde_json::from_str(case).unwrap();
        assert_eq!(case["rows"], 40000, "{case}");
        assert_eq!(case["in_order"], true, "{case}");
    }
    // The server's events: the order executions were registered in (after admission) and
    // how many ran at once.
    let events = wait_for_events(&events, 10);
    let mut started = Vec::new();
    let mut running = 0usize;
    let mut most = 0usize;
    let mut users = std::collections::HashMap::new();
    for e in &events {
        let op = e["operation_id"].as_str().unwrap_or("").to_owned();
        match e["kind"].as_str().unwrap() {
            "OperationStarted" => {
                let user = e["user_id"].as_str().unwrap().to_owned();
                started.push(user.clone());
                users.insert(op, user);
                running += 1;
                most = most.max(running);
            }
            "OperationFinished" | "OperationFailed" | "OperationCanceled" => running -= 1,
            _ => {}
        }
    }
    let expected: Vec<String> = (0..10).map(|i| format!("tether-admission-{i}")).collect();
    assert_eq!(started, expected, "registered in submission order");
    assert_eq!(
        most, 3,
        "at most three ran at once, and the cap was reached"
    );
    let stats = server
        .stdout_lines()
        .into_iter()
        .filter(|l| l.starts_with("stats "))
        .collect::<Vec<_>>();
    assert!(
        stats.iter().any(|l| !l.contains("admission_waiting=0")),
        "some execution waited: {stats:?}"
    );
}

fn tempdir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tether-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
