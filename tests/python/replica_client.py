"""One real PySpark client (pyspark-client) of scripts/replicas.py: a session routed by a
proxy in front of several tether servers, reading spark.range(N) once (or Q times).

Run with the interpreter of target/pyspark-venv (scripts/pyspark-env.sh):

    python tests/python/replica_client.py PORT SESSION_ID [--rows N] [--iterate]
        [--pace SECONDS] [--queries Q] [--label NAME] [--no-header]

The connection string is `sc://127.0.0.1:PORT/;session_id=S;user_id=replicas;
x-spark-connect-session-id=S`: `session_id` is the session PySpark opens (it travels in
every request's body), and the extra parameter `x-spark-connect-session-id` travels as gRPC
metadata, an HTTP/2 header of that name on every RPC, which the proxy routes on
(docs/deployment.md). `--no-header` leaves the extra parameter out.

- default: `toArrow()`, one ExecutePlan read across the server's stream rotations; the `id`
  column must be 0 ..< N, every id once and in order.
- `--iterate`: the reader of `toLocalIterator()` (one Arrow table per batch of 10 000 rows,
  without the conversion to Rows), sleeping PACE seconds after each batch, so that the read
  lasts long enough for the orchestrator to kill or drain the replica in the middle of it;
  prints `STARTED {json}` once the first rows arrived.
- `--queries Q`: Q reads in the same session, one after the other; before each read after
  the first it prints `WAITING {json}` and waits for a line on stdin.

Prints `DONE {json}` per read (rows, sum, seconds since the read's start, `at`: the wall
clock) and exits 0 when every id came once and in order; prints `ERROR {json}` (the
exception's class, Spark condition, gRPC status code, message, rows read, seconds, `at`) and
exits 2 when a read failed with an error (no later read is tried); exits 1 (with a
traceback) when the data were wrong, and 3 with a message starting with "ENV:" when
pyspark-client cannot be imported. The session is stopped (`spark.stop()`) either way, so
no exit-hook command is sent; a failed stop prints `STOP-ERROR {json}`.
"""

import argparse
import json
import sys
import time

from client_env import require

np, grpc, connect_session, errors = require(
    "numpy", "grpc", "pyspark.sql.connect.session", "pyspark.errors")
ConnectSession = connect_session.SparkSession


def say(kind, **fields):
    print(f"{kind} {json.dumps(fields, sort_keys=True)}", flush=True)


def describe(e):
    """The error as a user sees it: class, Spark condition, gRPC code, message."""
    out = {"class": type(e).__name__, "message": str(e).strip()[:600]}
    if isinstance(e, errors.PySparkException):
        out["condition"] = e.getCondition()
    code = getattr(e, "getGrpcStatusCode", None)
    if callable(code) and code() is not None:
        out["grpc_code"] = code().name
    elif isinstance(e, grpc.RpcError):
        out["grpc_code"] = e.code().name
    return out


class Read:
    """One read of spark.range(n); `rows` and `total` grow as batches arrive."""

    def __init__(self, label, session):
        self.label, self.session = label, session
        self.rows = self.total = 0
        self.start = time.monotonic()

    def seconds(self):
        return round(time.monotonic() - self.start, 3)

    def run(self, spark, n, iterate, pace):
        df = spark.range(n)
        if iterate:
            # toLocalIterator()'s own reader, one Arrow table per batch, without its
            # conversion to Rows (a million Rows cost seconds of CPU per client).
            plan = df._plan.to_proto(spark.client)
            for table in spark.client.to_table_as_iterator(plan, df._plan.observations):
                if not hasattr(table, "column"):
                    continue  # the schema
                ids = table.column("id").to_numpy()
                want = np.arange(self.rows, self.rows + len(ids), dtype=ids.dtype)
                if not np.array_equal(ids, want):
                    raise AssertionError(f"{self.label}: rows {self.rows}.. are not in order")
                if self.rows == 0:
                    say("STARTED", label=self.label, session=self.session,
                        seconds=self.seconds(), at=time.time())
                self.rows += len(ids)
                self.total += int(ids.sum())
                time.sleep(pace)
        else:
            ids = df.toArrow().column("id").to_numpy()
            if len(ids) != n:
                raise AssertionError(f"{self.label}: {len(ids)} ids, {n} expected")
            want = np.arange(n, dtype=ids.dtype)
            if not np.array_equal(ids, want):
                first = int(np.argmax(ids != want))
                raise AssertionError(f"{self.label}: id {ids[first]} at row {first}")
            self.rows, self.total = len(ids), int(ids.sum())
        if self.rows != n or self.total != n * (n - 1) // 2:
            raise AssertionError(f"{self.label}: {self.rows} rows, sum {self.total}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("session_id")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--iterate", action="store_true")
    parser.add_argument("--pace", type=float, default=0.0)
    parser.add_argument("--queries", type=int, default=1)
    parser.add_argument("--label", default="")
    parser.add_argument("--no-header", action="store_true")
    args = parser.parse_args()
    s = args.session_id
    url = f"sc://127.0.0.1:{args.port}/;session_id={s};user_id=replicas"
    if not args.no_header:
        url += f";x-spark-connect-session-id={s}"
    outcome = 0
    spark = ConnectSession.builder.remote(url).create()
    try:
        for query in range(args.queries):
            if query:
                say("WAITING", label=args.label, session=s, query=query)
                sys.stdin.readline()
            read = Read(args.label, s)
            try:
                read.run(spark, args.rows, args.iterate, args.pace)
            except AssertionError:
                raise
            except Exception as e:  # noqa: BLE001 - the orchestrator judges what PySpark raised
                say("ERROR", label=args.label, session=s, query=query, rows=read.rows,
                    seconds=read.seconds(), at=time.time(), **describe(e))
                outcome = 2
                break
            say("DONE", label=args.label, session=s, query=query, rows=read.rows,
                sum=read.total, seconds=read.seconds(), at=time.time())
    finally:
        try:
            spark.stop()
        except Exception as e:  # noqa: BLE001 - a stopped replica may refuse the release
            say("STOP-ERROR", label=args.label, **describe(e))
    sys.exit(outcome)


if __name__ == "__main__":
    main()
