"""The real Spark Connect Python client (pyspark-client) against tether's example server.

Run by tests/rx/pyspark_connect.rs with the interpreter of target/pyspark-venv
(scripts/pyspark-env.sh), against examples/connect_server listening on loopback:

    python tests/python/pyspark_checks.py data PORT [--rows N] [--short-queries Q] [--real-spark]
        collect(), toArrow(), toLocalIterator(), count() and limit() on spark.range(N)
        (default 200000): every row exactly once and in order; schemas; errors; Q short
        queries (default 150). With --real-spark (the server is Spark itself, scripts/
        real-spark.sh), the plan tether's example does not run must run instead. Then prints
        `READY {json}` and waits for a line on stdin (the test reads the server's stats
        meanwhile), and exits without stopping the session, as a script that just ends does.

    python tests/python/pyspark_checks.py auth PORT TOKEN
        the right token works; a wrong and a missing one fail with PySpark's error for
        UNAUTHENTICATED and the server's message.

    python tests/python/pyspark_checks.py tls PORT TOKEN [--rows N]
        over TLS (`;use_ssl=true;token=TOKEN`, the test's CA through
        GRPC_DEFAULT_SSL_ROOTS_FILE_PATH): spark.range(N).collect() in one execution, every id
        once and in order; a wrong token fails with UNAUTHENTICATED. Prints `TLS OK {json}`.

    python tests/python/pyspark_checks.py tls-fail PORT [--param KEY=VALUE ...]
        one query on `sc://localhost:PORT/;KEY=VALUE…` that must fail, without retries
        (PySpark retries UNAVAILABLE for minutes by default). Prints `TLS-FAIL {json}` with
        the exception's class, gRPC status code and message.

    python tests/python/pyspark_checks.py error-details PORT
        spark.range(10).limit(-1).collect() must fail; PySpark builds the exception from the
        server's FetchErrorDetails answer (the errorId of the error's ErrorInfo). Prints
        `ERROR-DETAILS {json}`: the exception's class, getCondition(), getMessageParameters(),
        getSqlState(), the first line of its message, and what FetchErrorDetails answered
        (root_error_idx, the errors' classes); then a FetchErrorDetails of the same id again
        (answered once: empty) and of an unknown id (empty, no root_error_idx).

    python tests/python/pyspark_checks.py config PORT [TOKEN]
        spark.range(10).toPandas() (PySpark reads the server's defaults for it); a GetAll
        with a prefix answers the keys without it; a key Spark's redaction pattern matches
        reads as absent (conf.get fails with SQL_CONF_NOT_FOUND, conf.get(key, default) is
        the default, getAll leaves it out). With TOKEN (the server's): its key can be
        neither read nor set (CANNOT_MODIFY_STATIC_CONFIG), a value holding it reads as
        absent, and no Config answer or error PySpark saw carries it. Prints
        `CONFIG OK {json}`.

Exit status: 0 when every check passed, 1 (with a traceback) when one failed, 3 with a
message starting with "ENV:" when pyspark-client cannot be imported.
"""

import argparse
import json
import sys
import time

from client_env import require

N = 200_000
SHORT_QUERIES = 150
REAL_SPARK = False

grpc, pa, connect_errors, F, connect_session, types = require(
    "grpc", "pyarrow", "pyspark.errors.exceptions.connect", "pyspark.sql.functions",
    "pyspark.sql.connect.session", "pyspark.sql.types")
SparkConnectGrpcException = connect_errors.SparkConnectGrpcException
ConnectSession = connect_session.SparkSession
LongType, StructField, StructType = types.LongType, types.StructField, types.StructType

EXECUTIONS = 0


class CountExecutions(ConnectSession.Hook):
    """Counts the ExecutePlan requests the client sends (each starts one execution)."""

    def __init__(self, _session):
        pass

    def on_execute_plan(self, request):
        global EXECUTIONS
        EXECUTIONS += 1
        return request


def session(port, **params):
    """A new session (never a cached one) on `sc://localhost:PORT/;k=v…`."""
    # The host must be `localhost`: PySpark sends a token only over local credentials there.
    url = f"sc://localhost:{port}/" + "".join(f";{k}={v}" for k, v in params.items())
    # `_registerHook` is pyspark-client's (private) way to add a session hook.
    return ConnectSession.builder.remote(url)._registerHook(CountExecutions).create()


def expect_ids(got, want, what):
    if got != want:
        first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        raise AssertionError(
            f"{what}: {len(got)} rows, {len(want)} expected; first difference at row {first}: "
            f"{got[first:first + 3]} vs {want[first:first + 3]}"
        )


def data(port):
    spark = session(port, user_id="tether-pyspark")
    want = list(range(N))
    timings = {}

    def timed(name, f):
        start = time.monotonic()
        result = f()
        timings[name] = round(timings.get(name, 0) + time.monotonic() - start, 3)
        return result

    df = spark.range(N)
    assert df.schema == StructType([StructField("id", LongType(), False)]), df.schema

    rows = timed("collect", df.collect)
    expect_ids([r.id for r in rows], want, "collect()")

    table = timed("toArrow", df.toArrow)
    assert table.schema.field("id").type == pa.int64(), table.schema
    expect_ids(table.column("id").to_pylist(), want, "toArrow()")

    ids = timed("toLocalIterator", lambda: [r.id for r in df.toLocalIterator()])
    expect_ids(ids, want, "toLocalIterator()")

    assert timed("count", df.count) == N

    # limit() inside the first partition, across the partition boundary, and count() of it.
    for n in (12_345, 150_000):
        got = timed(f"limit({n})", lambda: [r.id for r in df.limit(n).collect()])
        expect_ids(got, want[:n], f"limit({n}).collect()")
        assert df.limit(n).count() == n
    assert df.limit(0).collect() == []

    # A stepped range, and an empty one.
    expect_ids([r.id for r in spark.range(5, 100_007, 3).collect()], list(range(5, 100_007, 3)),
               "range(5, 100007, 3)")
    assert spark.range(0).collect() == [] and spark.range(0).count() == 0

    # count()'s column as Spark names it.
    counted = df.agg(F.count(F.lit(1)))
    assert counted.columns == ["count(1)"], counted.columns
    assert counted.collect()[0][0] == N

    if REAL_SPARK:
        # Spark runs what the example server does not.
        assert [r[0] for r in spark.range(3).selectExpr("id + 1").collect()] == [1, 2, 3]
    else:
        # A plan the server does not run: Spark's error for one, not a hang or a crash.
        try:
            spark.range(3).selectExpr("id + 1").collect()
            raise AssertionError("an unsupported plan must fail")
        except SparkConnectGrpcException as e:
            assert e.getCondition() == \
                "CONNECT_INVALID_PLAN.INVALID_ONE_OF_FIELD_NOT_SUPPORTED", str(e)
            assert "PROJECT(3)" in str(e), str(e)
            assert e.getGrpcStatusCode() == grpc.StatusCode.INTERNAL, e.getGrpcStatusCode()

    # Engine errors in Spark's form: PySpark raises the same exception class as against real
    # Spark (connect §6.3), with the condition and SQLSTATE from the rich status.
    from pyspark.errors import AnalysisException, IllegalArgumentException
    try:
        spark.range(10).limit(-1).collect()
        raise AssertionError("a negative limit must fail")
    except AnalysisException as e:
        assert e.getCondition() == "INVALID_LIMIT_LIKE_EXPRESSION.IS_NEGATIVE", e.getCondition()
        assert e.getSqlState() == "42K0E", e.getSqlState()
    try:
        spark.range(0, 10, 0).collect()
        raise AssertionError("a step of 0 must fail")
    except IllegalArgumentException as e:
        assert "step (0) cannot be 0" in str(e), str(e)

    # Many short queries: under the server's --faults, some ExecutePlan streams are cut
    # before their first response and the operation forgotten, so PySpark's re-execute path
    # (reattach -> OPERATION_NOT_FOUND -> the same ExecutePlan again) runs.
    for i in range(SHORT_QUERIES):
        n = i % 7 + 1
        got = timed("short", lambda: [r.id for r in spark.range(n).collect()])
        expect_ids(got, list(range(n)), f"short query {i}")

    # The server checks its live executions now (every release has been sent: ReleaseAll is
    # asynchronous, so it waits with a deadline); then exit without spark.stop().
    print("READY " + json.dumps({"executions": EXECUTIONS, "timings": timings}), flush=True)
    if REAL_SPARK:
        # Nothing to read on Spark's side: stop cleanly (without it the exit hook's command,
        # which Spark answers, leaves pyspark-client's release pool hanging at exit).
        spark.stop()
        return
    sys.stdin.readline()


def auth(port, token):
    good = session(port, user_id="tether-auth", token=token)
    assert [r.id for r in good.range(5).collect()] == [0, 1, 2, 3, 4]
    assert good.range(1000).count() == 1000
    good.stop()
    for label, params, message in [
        ("wrong", {"token": token + "x"}, "Invalid authentication token"),
        ("missing", {}, "No authentication token provided"),
    ]:
        spark = session(port, user_id="tether-auth", **params)
        try:
            spark.range(1).collect()
            raise AssertionError(f"a {label} token must be refused")
        except SparkConnectGrpcException as e:
            assert e.getGrpcStatusCode() == grpc.StatusCode.UNAUTHENTICATED, (label, e)
            assert message in str(e), (label, str(e))
    print("AUTH OK", flush=True)


def tls(port, token):
    spark = session(port, user_id="tether-tls", use_ssl="true", token=token)
    before = EXECUTIONS
    ids = [r.id for r in spark.range(N).collect()]
    executions = EXECUTIONS - before
    assert executions == 1, f"{executions} ExecutePlan requests for one collect()"
    expect_ids(ids, list(range(N)), "collect() over TLS")
    assert sum(ids) == N * (N - 1) // 2, sum(ids)
    spark.stop()
    wrong = session(port, user_id="tether-tls", use_ssl="true", token=token + "x")
    try:
        wrong.range(1).collect()
        raise AssertionError("a wrong token must be refused over TLS too")
    except SparkConnectGrpcException as e:
        assert e.getGrpcStatusCode() == grpc.StatusCode.UNAUTHENTICATED, e
        assert "Invalid authentication token" in str(e), str(e)
    report = {"rows": len(ids), "sum": sum(ids), "executions": executions}
    print("TLS OK " + json.dumps(report), flush=True)


def tls_fail(port, params):
    try:
        spark = session(port, user_id="tether-tls", **params)
        # No retries: the handshake fails the same way every time.
        spark.client.set_retry_policies([])
        spark.range(1).collect()
        raise AssertionError(f"a query with {params} must fail")
    except AssertionError:
        raise
    except Exception as e:  # noqa: BLE001 - the test reads whatever PySpark raised
        code = e.getGrpcStatusCode() if isinstance(e, SparkConnectGrpcException) else None
        report = {"class": type(e).__name__, "code": str(code), "message": str(e)}
        print("TLS-FAIL " + json.dumps(report), flush=True)


def error_details(port):
    spark = session(port, user_id="tether-error-details")
    client = spark.client
    answers = []
    fetch = client._fetch_enriched_error

    def recording(info):
        answer = fetch(info)
        answers.append((info.metadata.get("errorId"), answer))
        return answer

    client._fetch_enriched_error = recording
    try:
        spark.range(10).limit(-1).collect()
        raise AssertionError("a negative limit must fail")
    except connect_errors.AnalysisException as e:
        error = e
    # The last error PySpark handled is the one it raised (an earlier one may be a conf it
    # reads on its own, such as a plan compression setting the server does not have).
    assert answers, "PySpark asked FetchErrorDetails"
    error_id, answer = answers[-1]
    assert error_id is not None, "the error's ErrorInfo carries an errorId"
    assert answer is not None and answer.HasField("root_error_idx"), answer
    root = answer.errors[answer.root_error_idx]

    def again(eid):
        import pyspark.sql.connect.proto as pb2
        req = pb2.FetchErrorDetailsRequest(session_id=client._session_id, error_id=eid)
        req.user_context.user_id = client._user_id
        return client._stub.FetchErrorDetails(req, metadata=client._builder.metadata())

    second, unknown = again(error_id), again("00112233-4455-6677-8899-aabbccddeeff")
    report = {
        "class": type(error).__name__,
        "condition": error.getCondition(),
        "parameters": error.getMessageParameters(),
        "sql_state": error.getSqlState(),
        "message": str(error).splitlines()[0],
        "root_error_idx": answer.root_error_idx,
        "errors": len(answer.errors),
        "fetched": len(answers),
        "classes": list(root.error_type_hierarchy),
        "details_condition": root.spark_throwable.error_class,
        "second_fetch_empty": second.ByteSize() == 0,
        "unknown_fetch_empty": unknown.ByteSize() == 0,
    }
    print("ERROR-DETAILS " + json.dumps(report, sort_keys=True), flush=True)
    spark.stop()


def config(port, token):
    import pyspark.sql.connect.proto as pb2
    params = {"user_id": "tether-config"}
    if token:
        params["token"] = token
    spark = session(port, **params)
    client = spark.client
    seen = []
    answer = client.config

    def recording(operation):
        result = answer(operation)
        seen.append(repr((result.pairs, result.warnings)))
        return result

    client.config = recording

    def fails(call, condition):
        try:
            call()
        except connect_errors.SparkConnectGrpcException as e:
            seen.append(str(e))
            assert e.getCondition() == condition, (condition, e.getCondition(), str(e))
            return type(e).__name__
        raise AssertionError(f"expected {condition}")

    pdf = spark.range(10).toPandas()
    assert list(pdf["id"]) == list(range(10)), pdf
    assert str(pdf["id"].dtype) == "int64", pdf.dtypes
    spark.conf.set("spark.tether.a", "1")
    spark.conf.set("spark.tether.b", "2")
    spark.conf.set("spark.tether.my.password", "hunter2")

    def get_all(prefix):
        op = pb2.ConfigRequest.Operation(get_all=pb2.ConfigRequest.GetAll(prefix=prefix))
        return dict(client.config(op).pairs)

    prefixed = get_all("spark.tether.")
    assert prefixed == {"a": "1", "b": "2"}, prefixed
    assert get_all("spark.tether.a") == {"": "1"}
    every = spark.conf.getAll
    assert every.get("spark.tether.a") == "1", every
    assert not any("password" in k for k in every), every
    redacted = fails(lambda: spark.conf.get("spark.tether.my.password"), "SQL_CONF_NOT_FOUND")
    assert spark.conf.get("spark.tether.my.password", "d") == "d"
    report = {"to_pandas": len(pdf), "get_all": prefixed, "redacted": redacted}
    if token:
        key = "spark.connect.authenticate.token"
        fails(lambda: spark.conf.get(key), "SQL_CONF_NOT_FOUND")
        assert spark.conf.get(key, None) is None
        report["set_token"] = fails(lambda: spark.conf.set(key, token),
                                    "CANNOT_MODIFY_STATIC_CONFIG")
        fails(lambda: spark.conf.unset(key), "CANNOT_MODIFY_STATIC_CONFIG")
        spark.conf.set("spark.tether.copy", token)
        assert spark.conf.get("spark.tether.copy", None) is None
        assert "spark.tether.copy" not in spark.conf.getAll
        assert get_all("spark.tether.c") == {}
        report["answers"] = len(seen)
        leaked = [a for a in seen if token in a]
        assert not leaked, leaked
    spark.stop()
    print("CONFIG OK " + json.dumps(report, sort_keys=True), flush=True)


def main():
    global N, SHORT_QUERIES, REAL_SPARK
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["data", "auth", "tls", "tls-fail", "error-details",
                                           "config"])
    parser.add_argument("port", type=int)
    parser.add_argument("token", nargs="?")
    parser.add_argument("--rows", type=int, default=N)
    parser.add_argument("--short-queries", type=int, default=SHORT_QUERIES)
    parser.add_argument("--real-spark", action="store_true")
    parser.add_argument("--param", action="append", default=[])
    args = parser.parse_args()
    N, SHORT_QUERIES, REAL_SPARK = args.rows, args.short_queries, args.real_spark
    if args.mode == "data":
        data(args.port)
    elif args.mode == "auth":
        auth(args.port, args.token)
    elif args.mode == "error-details":
        error_details(args.port)
    elif args.mode == "config":
        config(args.port, args.token)
    elif args.mode == "tls":
        tls(args.port, args.token)
    else:
        tls_fail(args.port, dict(p.split("=", 1) for p in args.param))


if __name__ == "__main__":
    main()
