"""The Spark Connect benchmark (scripts/bench-connect.sh): tether's server against the real
Spark 4.3.0 server and against a bare tonic baseline, read by the real PySpark client and by
tether's own Rust client, all on loopback in one run.

Servers, in two phases (one JVM at a time):

- default settings: Spark (`spark-oracle.sh start`), tether's
  examples/connect_server, and the same engine served bare (`--baseline bare`);
- 123-byte rotation (every stream ends after one response): Spark (`rotate`), tether with
  `--max-stream-bytes 123 --max-stream-duration-ms 1000`, and the bare rotating baseline
  (`--baseline bare-rotating`), whose only cost is the client's reattach round trip.

All of them send one Arrow batch of 10 000 rows per response (Spark's
maxRecordsPerBatch default, connect §6.2), and all compute their batches (the tether
server and the baselines run the same engine).

Clients, against every server: PySpark `spark.range(ROWS).toArrow()` (this interpreter
must be target/pyspark-venv's; the responses and ReattachExecute calls are counted by
wrapping the client's stub), and tether's `examples/connect_client` (release build). Each
(server, client) pair: WARMUP runs discarded (the JVM needs about three), then the median
of RUNS.

Usage: python scripts/bench_connect.py TARGET_RELEASE_DIR [--rows N] [--runs R]
[--warmup W] [--observability | --tls | --chunking]. With --chunking: one tether server
read by a PySpark session that allows result chunking (its default) and one that does not
(connect §10), paired rounds, twice: the default 10 000 rows per batch (every batch chunk 0
of 1), and 1 000 000 rows per batch (8 MB) read in 1 MiB chunks against whole. With --tls: tether over TLS against tether in
plaintext, the same paired rounds (certificates from openssl under target/bench-tls). With
--observability: only tether's server with its metrics
exported and its events written against the same without (paired ABBA rounds of PySpark's
toArrow(), default settings; no Spark needed). Prints a Markdown table (rows/s, responses/s, reattaches per run) and the
targets with their verdicts, also written as JSON to target/bench-connect.json.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "python"))
from client_env import require  # noqa: E402

(connect_session,) = require("pyspark.sql.connect.session")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORACLE = os.path.join(REPO, "scripts", "spark-oracle.sh")
ROTATION = ["--max-stream-bytes", "123", "--max-stream-duration-ms", "1000"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load():
    return os.getloadavg()[0]


class Counted:
    """A response iterator of the stub that counts what it yields."""

    def __init__(self, inner, tally):
        self._inner, self._tally = inner, tally

    def __iter__(self):
        return self

    def __next__(self):
        item = next(self._inner)
        self._tally["responses"] += 1
        return item

    def __getattr__(self, name):
        return getattr(self._inner, name)


def count_calls(stub, tally):
    for method in ("ExecutePlan", "ReattachExecute"):
        original = getattr(stub, method)

        def call(*args, _original=original, _method=method, **kwargs):
            tally[_method] += 1
            return Counted(_original(*args, **kwargs), tally)

        setattr(stub, method, call)


def pyspark_runs(port, rows, warmup, runs):
    spark = connect_session.SparkSession.builder.remote(
        f"sc://localhost:{port}/;user_id=bench").create()
    tally = {"responses": 0, "ExecutePlan": 0, "ReattachExecute": 0}
    count_calls(spark.client._stub, tally)
    times, responses, reattaches = [], [], []
    for i in range(warmup + runs):
        for k in tally:
            tally[k] = 0
        start = time.perf_counter()
        table = spark.range(rows).toArrow()
        elapsed = time.perf_counter() - start
        if table.num_rows != rows:
            raise SystemExit(f"PySpark read {table.num_rows} rows, not {rows}")
        if i >= warmup:
            times.append(elapsed)
            responses.append(tally["responses"])
            reattaches.append(tally["ReattachExecute"])
    spark.stop()
    return summary(rows, times, statistics.median(responses), statistics.median(reattaches))


def rust_runs(client, port, rows, warmup, runs):
    times, responses, reattaches = [], [], []
    for i in range(warmup + runs):
        out = subprocess.run([client, "--url", f"http://127.0.0.1:{port}", "--rows", str(rows)],
                             capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            raise SystemExit(f"connect_client failed: {out.stderr}")
        result = json.loads(next(l for l in out.stdout.splitlines()
                                 if l.startswith("RESULT "))[7:])
        if i >= warmup:
            times.append(result["seconds"])
            responses.append(result["responses"])
            reattaches.append(result["reattaches"])
    return summary(rows, times, statistics.median(responses), statistics.median(reattaches))


def summary(rows, times, responses, reattaches):
    median = statistics.median(times)
    return {"seconds": median, "rows_per_s": rows / median,
            "responses_per_s": responses / median, "responses": responses,
            "reattaches": reattaches, "runs": [round(t, 4) for t in times]}


class Tether:
    """examples/connect_server (release), tether or a bare baseline."""

    def __init__(self, target, args):
        self.proc = subprocess.Popen(
            [os.path.join(target, "examples", "connect_test_server"), "--port", "0",
             "--stats-interval-ms", "60000", *args],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env={**os.environ, "RUST_LOG": "warn"})
        line = self.proc.stdout.readline()
        while line.startswith("metrics on "):
            line = self.proc.stdout.readline()
        if not line.startswith("listening on "):
            raise SystemExit(f"connect_server did not start: {line!r}")
        threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()
        self.port = int(line.rsplit(":", 1)[1])

    def stop(self):
        self.proc.kill()
        self.proc.wait()


class Spark:
    def __init__(self, mode):
        self.port = free_port()
        subprocess.run(["bash", ORACLE, mode, str(self.port)], check=True, timeout=300,
                       stdout=subprocess.DEVNULL)

    def stop(self):
        subprocess.run(["bash", ORACLE, "stop", str(self.port)], check=False)
        time.sleep(2)


def paired(args, label, arms, out):
    """Two tether servers, `arms` = ((name, server, connection-string suffix), …) with the
    reference arm first, PySpark default settings: paired rounds alternating the order
    (ABBA), one toArrow() per server per round, each round's throughput ratio (second arm
    over the first); prints the median ratio with its interquartile range and writes the
    runs to target/`out`."""
    (ref, _, _, *_), (other, _, _, *_) = arms
    sessions = {}
    for name, server, suffix, *setup in arms:
        spark = connect_session.SparkSession.builder.remote(
            f"sc://localhost:{server.port}/;user_id=bench{suffix}").create()
        for step in setup:
            step(spark)
        for _ in range(args.warmup):
            spark.range(args.rows).toArrow()
        sessions[name] = spark

    def once(name):
        start = time.perf_counter()
        table = sessions[name].range(args.rows).toArrow()
        elapsed = time.perf_counter() - start
        if table.num_rows != args.rows:
            raise SystemExit(f"PySpark read {table.num_rows} rows, not {args.rows}")
        return elapsed

    ratios, times = [], {ref: [], other: []}
    load_before = load()
    for r in range(args.runs):
        order = (ref, other) if r % 2 == 0 else (other, ref)
        got = {name: once(name) for name in order}
        for name, t in got.items():
            times[name].append(t)
        ratios.append(got[ref] / got[other])
    for spark in sessions.values():
        spark.stop()
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    line = (f"PySpark toArrow of range({args.rows}), default settings, {args.runs} paired "
            f"ABBA rounds after {args.warmup} warm-up runs each (load {load_before:.1f}–"
            f"{load():.1f}): {ref} {statistics.median(times[ref]):.3f} s, {other} "
            f"{statistics.median(times[other]):.3f} s, throughput ratio {other}/{ref} "
            f"{statistics.median(ratios):.3f} [IQR {q[0]:.3f}–{q[2]:.3f}]{label}")
    print(line)
    with open(os.path.join(REPO, "target", out), "w") as f:
        json.dump({"ratios": ratios, "times": times, "rows": args.rows}, f, indent=1)


def observability(args):
    """tether's server with its metrics exported and every event written (`--metrics-addr`,
    `--events-log`) against the same server with neither (target >= 0.97)."""
    plain = Tether(args.target, [])
    observed = Tether(args.target, ["--metrics-addr", f"127.0.0.1:{free_port()}",
                                    "--events-log", os.devnull])
    try:
        paired(args, " (target >= 0.97)",
               (("plain", plain, ""), ("observed", observed, "")),
               "bench-connect-observability.json")
    finally:
        plain.stop()
        observed.stop()


def chunking(args):
    """PySpark allowing result chunking (connect §10) against PySpark not allowing it, from
    one tether server: with the default batches, then with 8 MB batches read in 1 MiB
    chunks (goal: within 5 %)."""
    def chunked(preferred):
        def setup(spark):
            spark.client._allow_arrow_batch_chunking = True
            spark.client._preferred_arrow_chunk_size = preferred
        return setup

    def whole(spark):
        spark.client._allow_arrow_batch_chunking = False

    for batch, preferred, label in ((10_000, None, "10 000 rows per batch"),
                                    (1_000_000, 1 << 20, "1 000 000 rows (8 MB) per batch, "
                                                         "1 MiB chunks")):
        server = Tether(args.target, ["--max-records-per-batch", str(batch)])
        try:
            paired(args, f"; {label} (goal >= 0.95)",
                   (("whole", server, "", whole), ("chunked", server, "", chunked(preferred))),
                   f"bench-connect-chunking-{batch}.json")
        finally:
            server.stop()


def tls_certificates(directory):
    """A throwaway CA and a server certificate for localhost it signed (openssl; written
    under target/, never committed); returns (ca, cert, key) paths."""
    os.makedirs(directory, exist_ok=True)
    ca, ca_key = os.path.join(directory, "ca.pem"), os.path.join(directory, "ca.key")
    cert, key = os.path.join(directory, "server.pem"), os.path.join(directory, "server.key")
    csr, ext = os.path.join(directory, "server.csr"), os.path.join(directory, "server.ext")
    run = lambda *a: subprocess.run(["openssl", *a], check=True, capture_output=True)
    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", ca_key, "-out", ca, "-days", "2", "-subj", "/CN=tether bench CA")
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", key, "-out", csr, "-subj", "/CN=localhost")
    with open(ext, "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    run("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
        "-out", cert, "-days", "2", "-extfile", ext)
    return ca, cert, key


def tls(args):
    """tether's server over TLS (`--tls-cert`, `--tls-key`; PySpark with `use_ssl=true`,
    trusting the bench's CA through GRPC_DEFAULT_SSL_ROOTS_FILE_PATH) against the same
    server in plaintext."""
    ca, cert, key = tls_certificates(os.path.join(REPO, "target", "bench-tls"))
    # Read by gRPC when PySpark opens its first TLS channel.
    os.environ["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = ca
    plain = Tether(args.target, [])
    secure = Tether(args.target, ["--tls-cert", cert, "--tls-key", key])
    try:
        paired(args, "", (("plaintext", plain, ""), ("tls", secure, ";use_ssl=true")),
               "bench-connect-tls.json")
    finally:
        plain.stop()
        secure.stop()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("target")
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--observability", action="store_true",
                        help="only tether with metrics and events against tether without")
    parser.add_argument("--chunking", action="store_true",
                        help="only PySpark allowing result chunking against not, one tether")
    parser.add_argument("--tls", action="store_true",
                        help="only tether over TLS against tether in plaintext")
    args = parser.parse_args()
    if args.observability:
        observability(args)
        return
    if args.chunking:
        chunking(args)
        return
    if args.tls:
        tls(args)
        return
    client = os.path.join(args.target, "examples", "connect_client")
    results = {}
    loads = []
    phases = [
        ("default", "start", [], ["--baseline", "bare"]),
        ("rotating", "rotate", ROTATION, ["--baseline", "bare-rotating"]),
    ]
    for phase, spark_mode, tether_args, bare_args in phases:
        servers = {}
        try:
            servers["spark"] = Spark(spark_mode)
            servers["tether"] = Tether(args.target, tether_args)
            servers["bare"] = Tether(args.target, bare_args)
            for name, server in servers.items():
                for kind, run in (("pyspark", lambda p: pyspark_runs(p, args.rows, args.warmup,
                                                                     args.runs)),
                                  ("rust", lambda p: rust_runs(client, p, args.rows,
                                                               args.warmup, args.runs))):
                    print(f"== {phase} / {name} / {kind} client", file=sys.stderr, flush=True)
                    loads.append(load())
                    results[(phase, name, kind)] = run(server.port)
                    print(f"   {results[(phase, name, kind)]}", file=sys.stderr, flush=True)
        finally:
            for server in servers.values():
                server.stop()
    report(results, args, loads)


def report(results, args, loads):
    def ratio(a, b):
        return results[a]["rows_per_s"] / results[b]["rows_per_s"]

    targets = [
        ("PySpark toArrow, default settings: tether / Spark", 1.0,
         ratio(("default", "tether", "pyspark"), ("default", "spark", "pyspark"))),
        ("PySpark toArrow, 123-byte rotation: tether / bare rotating tonic", 0.8,
         ratio(("rotating", "tether", "pyspark"), ("rotating", "bare", "pyspark"))),
        ("PySpark toArrow, 123-byte rotation: tether / Spark", 1.2,
         ratio(("rotating", "tether", "pyspark"), ("rotating", "spark", "pyspark"))),
        ("tether's Rust client, default settings: tether / Spark", 2.0,
         ratio(("default", "tether", "rust"), ("default", "spark", "rust"))),
        ("tether's Rust client, default settings: tether / bare tonic", 0.8,
         ratio(("default", "tether", "rust"), ("default", "bare", "rust"))),
    ]
    lines = [
        f"range({args.rows}), median of {args.runs} runs after {args.warmup} warm-up runs; "
        f"load average during the runs {min(loads):.1f}–{max(loads):.1f}",
        "",
        "| settings | server | client | rows/s | responses/s | reattaches per run | median s |",
        "|---|---|---|---|---|---|---|",
    ]
    for (phase, name, kind), r in results.items():
        lines.append(f"| {phase} | {name} | {kind} | {r['rows_per_s']:,.0f} | "
                     f"{r['responses_per_s']:,.0f} | {r['reattaches']:.0f} | {r['seconds']:.3f} |")
    lines += ["", "| target | needed | measured | met |", "|---|---|---|---|"]
    for what, needed, got in targets:
        lines.append(f"| {what} | ≥ {needed}× | {got:.2f}× | {'yes' if got >= needed else 'NO'} |")
    print("\n".join(lines))
    out = os.path.join(REPO, "target", "bench-connect.json")
    with open(out, "w") as f:
        json.dump({"results": {"/".join(k): v for k, v in results.items()},
                   "targets": [{"what": w, "needed": n, "measured": g} for w, n, g in targets],
                   "load": [min(loads), max(loads)]}, f, indent=1)


if __name__ == "__main__":
    main()
