"""The CI-only real-Spark step (scripts/real-spark.sh): tether's client and server against
the real Spark 4.3.0 Spark Connect server, on loopback.

It starts both servers with the same settings: every stream rotated after one response
(123 bytes) or 1 s, detached executions abandoned after 2 s, maintenance every 1 s (the
real one by scripts/spark-oracle.sh rotate, tether's examples/connect_server).
Then, printing the time of each:

1. tether's client (examples/connect_client) reads spark.range(5000000) from Spark, and from
   tether: every row once and in order, ResultComplete, every release answered, and the
   execution gone afterwards (a reattach gets OPERATION_NOT_FOUND).
2. The same raw requests for each error case (tests/python/connect_scenarios.py errors,
   sessions: CloneSession and GetStatus, isolation, and a killed client's abandonment) go to
   both servers: the outcomes (gRPC code, condition, SQLSTATE, parameter names, whether an
   errorId comes with it, the exception class PySpark raises; for FetchErrorDetails, the
   answer without the JVM's stack trace) must be equal, case for case.
3. The cases of the table of deliberate differences (connect_scenarios.py differences and
   artifact-differences) get, from each server, exactly the answer the table documents for
   it (tether::spark::connect). Before them, the artifact requests both servers answer alike
   (connect_scenarios.py artifacts, and PySpark's own uploads, artifacts-pyspark) must get
   equal outcomes, case for case.
4. The real PySpark client runs tests/python/pyspark_checks.py data on spark.range(2000000)
   against both.
5. PySpark's exception for spark.range(10).limit(-1).collect(), built from the server's
   FetchErrorDetails answer (pyspark_checks.py error-details): class, condition, message
   parameters, SQLSTATE and the answer's shape must be equal.
6. The same raw Config requests (connect_scenarios.py config: GetAll with prefixes,
   redacted keys and values in every read, spark.connect.authenticate.token) to both
   servers: the answers, or the errors' outcomes, must be equal, case for case.

Usage: python3 scripts/real_spark.py TARGET_DIR PYSPARK_PYTHON
(scripts/real-spark.sh builds the binaries and the venv first). Exit status 0 when every
check held; 1 otherwise, with what differed.
"""

import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORACLE = os.path.join(REPO, "scripts", "spark-oracle.sh")
ROTATION = ["--max-stream-bytes", "123", "--max-stream-duration-ms", "1000"]
SPARK_CONFS = [
    "--conf", "spark.connect.execute.manager.detachedTimeout=2s",
    "--conf", "spark.connect.execute.manager.maintenanceInterval=1s",
]

# The table of deliberate differences (tether::spark::connect, "Where tether deliberately
# differs from Spark"), as the outcomes connect_scenarios.py reports for its cases: for
# each case, the outcome each server must give. Nothing else may differ.
DIFFERENCES = {
    "reattach_upper_case_operation_id": {
        "tether": {"code": "OK", "result": True},
        "spark": {"code": "INTERNAL", "condition": "INVALID_HANDLE.OPERATION_NOT_FOUND"},
    },
    "interrupt_running_operation": {
        "tether": {"code": "OK", "result": True},
        "spark": {"code": "OK", "result": True},
    },
    # Spark "can fail" it: either its illegal-state error or a success.
    "release_all_after_interrupt": {
        "tether": [{"code": "OK", "result": True}],
        "spark": [
            {"code": "INTERNAL", "condition": "SPARK_CONNECT_ILLEGAL_STATE."
             "STATE_CONSISTENCY_EXECUTION_STATE_TRANSITION_INVALID_OPERATION_STATUS_MISMATCH"},
            {"code": "OK", "result": True},
        ],
    },
}

# The artifact rows of that table (connect_scenarios.py artifact-differences): names Spark
# keeps and tether refuses, a cache/ name whose bytes have another SHA-256, a refused stream
# of which Spark keeps what came before, an empty stream.
_UP = ".."  # a parent segment (spelled apart: the repository's path check reads `../`)
for _name in ["files//x", "files\\x", "unknown/x", "x", f"files/a/{_UP}/b", "./files/x",
              "cache/notahash"]:
    DIFFERENCES[f"artifact_name {_name!r}"] = {
        "tether": {"code": "INTERNAL", "condition": "INVALID_ARTIFACT_PATH"},
        "spark": {"code": "OK", "result": [[_name, True]]},
    }
DIFFERENCES["artifact_name 'a\\x00b'"] = {
    "tether": {"code": "INTERNAL", "condition": "INVALID_ARTIFACT_PATH"},
    "spark": {"code": "INTERNAL", "condition": None,
              "reason": "java.nio.file.InvalidPathException"},
}
DIFFERENCES["artifact_wrong_hash"] = {
    "tether": {"code": "INTERNAL", "condition": "ARTIFACT_HASH_MISMATCH"},
    "spark": {"code": "OK"},
}
DIFFERENCES["artifact_refused_request"] = {
    "tether": {"code": "INTERNAL", "condition": "ARTIFACT_ALREADY_EXISTS", "first_kept": False},
    "spark": {"code": "INTERNAL", "condition": "ARTIFACT_ALREADY_EXISTS", "first_kept": True},
}
# Spark keeps what came before the refused name or not, depending on whether the stream's
# end reaches its handler after the error (measured both ways).
DIFFERENCES["artifact_bad_name_after_a_good_one"] = {
    "tether": {"code": "INTERNAL", "condition": "INVALID_ARTIFACT_PATH", "first_kept": False},
    "spark": [
        {"code": "INTERNAL", "condition": "INVALID_ARTIFACT_PATH", "first_kept": True},
        {"code": "INTERNAL", "condition": "INVALID_ARTIFACT_PATH", "first_kept": False},
    ],
}
DIFFERENCES["artifact_empty_stream"] = {
    "tether": {"code": "INTERNAL", "condition": None, "exception": "IllegalArgumentException"},
    "spark": {"code": "UNKNOWN"},
}

FAILURES = []


def fail(what):
    print(f"FAILED: {what}", flush=True)
    FAILURES.append(what)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Step:
    def __init__(self, name):
        self.name = name

    def __enter__(self):
        print(f"== {self.name}", flush=True)
        self.start = time.monotonic()
        return self

    def __exit__(self, kind, value, tb):
        print(f"   {self.name}: {time.monotonic() - self.start:.1f} s", flush=True)
        if kind in (AssertionError, subprocess.TimeoutExpired):
            fail(f"{self.name}: {value}")
            return True
        return False


def start_tether(target):
    binary = os.path.join(target, "examples", "connect_test_server")
    proc = subprocess.Popen(
        [binary, "--port", "0", *ROTATION, "--detached-timeout-ms", "2000",
         "--maintenance-interval-ms", "1000", "--stats-interval-ms", "1000"],
        stdout=subprocess.PIPE, stderr=open(os.path.join(target, "real-spark-tether.log"), "w"),
        text=True, env={**os.environ, "RUST_LOG": "info,tether::spark::connect=debug"})
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        raise SystemExit(f"tether's server did not start: {line!r}")
    # Keep reading stdout (stats lines) so the pipe never fills.
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
    return proc, int(line.rsplit(":", 1)[1])


def run(cmd, timeout, stdin=None):
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, input=stdin,
                          cwd=REPO, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(cmd[:3])}… exited {done.returncode}:\n"
                             f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return done.stdout


def cases(output):
    return [json.loads(line[5:]) for line in output.splitlines() if line.startswith("CASE ")]


def scenario(python, mode, port, *args, timeout=180):
    return cases(run([python, "tests/python/connect_scenarios.py", mode, str(port), *args],
                     timeout))


def same_cases(what, spark, tether):
    if len(spark) != len(tether):
        raise AssertionError(f"{what}: {len(spark)} cases from Spark, {len(tether)} from tether")
    for s, t in zip(spark, tether):
        if s != t:
            raise AssertionError(f"{what}: {s['case']} differs:\n  spark:  {s}\n  tether: {t}")
        print(f"   same: {s['case']}: {s['code']} {s.get('condition') or s.get('result')}")


def abandoned(python, port):
    """A client killed mid-query; then reattach and re-submit until the server abandoned
    its execution (detached timeout 2 s, maintenance 1 s)."""
    session, op = str(uuid.uuid4()), str(uuid.uuid4())
    client = subprocess.Popen(
        [python, "tests/python/connect_scenarios.py", "abandon-start", str(port), session, op],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        line = client.stdout.readline()
        if line.strip() != "STARTED":
            raise AssertionError(f"abandon-start: {line!r} {client.stderr.read()[-2000:]}")
    finally:
        client.kill()
        client.wait()
    # Each check's ReattachExecute attaches the execution (and fails: its first responses
    # were released), which restarts its detached clock: waiting less than the detached
    # timeout plus two maintenance intervals between checks can keep it alive forever (it
    # did, on a quiet machine where the check starts fast).
    pause = 4
    deadline = time.monotonic() + 60
    while True:
        time.sleep(pause)
        done = subprocess.run(
            [python, "tests/python/connect_scenarios.py", "abandon-check", str(port), session,
             op], capture_output=True, text=True, cwd=REPO, timeout=60)
        if done.returncode == 0:
            return cases(done.stdout)
        if time.monotonic() > deadline:
            raise AssertionError(f"not abandoned within 60 s by the server on port {port}:\n"
                                 f"{done.stdout}\n{done.stderr}")


# What pyspark_checks.py error-details reports that both servers must give alike (the
# message's text after the SQLSTATE and how many FetchErrorDetails PySpark sent on its own
# may differ).
ERROR_DETAILS_KEYS = ["class", "condition", "parameters", "sql_state", "classes",
                      "root_error_idx", "errors", "details_condition", "second_fetch_empty",
                      "unknown_fetch_empty"]


def error_details(python, port):
    out = run([python, "tests/python/pyspark_checks.py", "error-details", str(port)], 180)
    line = next(l for l in out.splitlines() if l.startswith("ERROR-DETAILS "))
    return json.loads(line[len("ERROR-DETAILS "):])


def same_error_details(reports):
    spark, tether = reports["spark"], reports["tether"]
    for key in ERROR_DETAILS_KEYS:
        if spark.get(key) != tether.get(key):
            raise AssertionError(f"error-details: {key} differs:\n  spark:  {spark.get(key)}"
                                 f"\n  tether: {tether.get(key)}")
    print(f"   same: {spark['class']} {spark['condition']} {spark['parameters']} "
          f"{spark['sql_state']}")


def documented(case, server):
    want = DIFFERENCES.get(case["case"])
    if want is None:
        raise AssertionError(f"{case['case']} is not in the table of differences")
    options = want[server] if isinstance(want[server], list) else [want[server]]
    if not any(all(case.get(k) == v for k, v in o.items()) for o in options):
        raise AssertionError(f"{server}: {case} is not the documented {options}")
    print(f"   documented ({server}): {case['case']}: {case['code']} "
          f"{case.get('condition') or case.get('result')}")


def main():
    target, python = sys.argv[1], sys.argv[2]
    began = time.monotonic()
    spark_port = free_port()
    with Step(f"start the real Spark 4.3.0 server on 127.0.0.1:{spark_port}"):
        subprocess.run(["bash", ORACLE, "rotate", str(spark_port), *SPARK_CONFS], check=True,
                       timeout=300)
    tether, tether_port = start_tether(target)
    print(f"   tether's example server on 127.0.0.1:{tether_port}")
    servers = {"spark": spark_port, "tether": tether_port}
    try:
        client = os.path.join(target, "examples", "connect_client")
        for name, port in servers.items():
            with Step(f"tether's client reads range(5000000) from {name}"):
                out = run([client, "--url", f"http://127.0.0.1:{port}", "--rows", "5000000",
                           "--verify-released"], 600)
                print("   " + out.strip())
        with Step("the same error requests to both servers"):
            same_cases("errors", scenario(python, "errors", spark_port),
                       scenario(python, "errors", tether_port))
        with Step("the same CloneSession and GetStatus requests to both servers"):
            same_cases("sessions", scenario(python, "sessions", spark_port),
                       scenario(python, "sessions", tether_port))
        with Step("isolation of users within one session id, on both servers"):
            same_cases("isolation", scenario(python, "isolation", spark_port),
                       scenario(python, "isolation", tether_port))
        with Step("a killed client's execution abandoned, on both servers"):
            same_cases("abandonment", abandoned(python, spark_port),
                       abandoned(python, tether_port))
        with Step("the same artifact requests to both servers"):
            same_cases("artifacts", scenario(python, "artifacts", spark_port),
                       scenario(python, "artifacts", tether_port))
        with Step("PySpark's artifact uploads to both servers"):
            uploads = {name: cases(run([python, "tests/python/connect_scenarios.py",
                                        "artifacts-pyspark", str(port)], 180, stdin="\n"))
                       for name, port in servers.items()}
            same_cases("artifacts-pyspark", uploads["spark"], uploads["tether"])
        with Step("the documented differences, each server as documented"):
            for name, port in servers.items():
                for case in scenario(python, "differences", port):
                    documented(case, name)
                for case in scenario(python, "artifact-differences", port):
                    documented(case, name)
        for name, port in servers.items():
            with Step(f"PySpark reads range(2000000) from {name}"):
                out = run([python, "tests/python/pyspark_checks.py", "data", str(port),
                           "--rows", "2000000", "--short-queries", "20"]
                          + (["--real-spark"] if name == "spark" else []), 900, stdin="\n")
                print("   " + next(l for l in out.splitlines() if l.startswith("READY")))
        with Step("PySpark's exception from FetchErrorDetails, on both servers"):
            same_error_details({name: error_details(python, port)
                                for name, port in servers.items()})
        with Step("the same Config requests to both servers"):
            same_cases("config", scenario(python, "config", spark_port),
                       scenario(python, "config", tether_port))
        with Step("spark.sql() answered with a sql_command_result, on both servers"):
            same_cases("sql", scenario(python, "sql", spark_port),
                       scenario(python, "sql", tether_port))
    finally:
        tether.kill()
        subprocess.run(["bash", ORACLE, "stop", str(spark_port)], check=False)
    print(f"== real-Spark step: {time.monotonic() - began:.0f} s, "
          f"{len(FAILURES)} failure(s)", flush=True)
    for f in FAILURES:
        print(f"   FAILED: {f.splitlines()[0]}")
    sys.exit(1 if FAILURES else 0)


if __name__ == "__main__":
    main()
