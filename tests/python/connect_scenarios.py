"""Spark Connect error, abandonment and isolation scenarios, run against any Spark Connect
server: tether's example server (tests/rx/pyspark_connect.rs) and, in CI, the real Spark 4.3.0
server, so that both servers' answers can be compared.

Run with the interpreter of target/pyspark-venv (scripts/pyspark-env.sh):

    python tests/python/connect_scenarios.py errors PORT
        Raw requests through pyspark-client's generated stubs: a reattach to an unknown
        operation (OPERATION_NOT_FOUND), a duplicate active operation id with another plan
        (OPERATION_ALREADY_EXISTS) and with the same plan (a reattach from the start),
        operation ids that are no UUID, an empty relation, an Interrupt in a brand-new
        session, a reattach in an unknown session; FetchErrorDetails of an unknown id, of
        an id that is no UUID, of a Config error's id (twice: answered once), with a session
        id that is no UUID, and in a released session. Prints one `CASE {json}` line per
        case: gRPC code, condition, SQLSTATE, messageParameters names, whether the error
        carries an errorId, and the exception class PySpark raises for it (or the answer,
        stack trace left out). Exits 0 after `ERRORS DONE`.

    python tests/python/connect_scenarios.py config PORT
        Raw Config requests in a new session: a Set of plain keys, a key and a value that
        Spark's redaction pattern matches; GetAll with prefixes (answered without them);
        Get, GetOption and GetWithDefault of the redacted entries (read as absent); a Set,
        Unset, Get, GetOption and IsModifiable of spark.connect.authenticate.token. Prints
        one `CASE {json}` line per case (the answer's pairs, or the error as in `errors`)
        and `CONFIG DONE`.

    python tests/python/connect_scenarios.py differences PORT
        The cases where tether deliberately differs from Spark: a reattach with an
        upper-case operation id, ReleaseAll after an Interrupt. Prints `CASE {json}` lines
        (not asserted: each server has its own documented answer) and `DIFFERENCES DONE`.

    python tests/python/connect_scenarios.py sessions PORT
        CloneSession and GetStatus (connect §14, §15). Raw requests: clones of an unknown, a
        malformed and a closed source, onto a malformed, a live and a closed target, with
        a wrong observed id; GetStatus of an unknown, a malformed and a closed session, of
        unknown operation ids, and of operations through their lives (running, finished
        and not released, released, interrupted, failed), polled until each settles and
        never back to running. Then PySpark's `cloneSession()`: the clone sees the
        source's configuration and the two are independent afterwards; a refused clone
        left no session behind. Prints `CASE {json}` lines (only outcomes, no ids, so
        that two servers' lines compare) and `SESSIONS DONE`.

    python tests/python/connect_scenarios.py isolation PORT
        User A runs range(200000).toLocalIterator() in session S. Mid-stream, user B with
        the same session id S (its own session) tries to reattach to, release and interrupt
        A's operation; each attempt must miss. Then A reads every row, once and in order.
        Prints `CASE {json}` per attempt of B and `ISOLATION OK`.

    python tests/python/connect_scenarios.py abandon-start PORT SESSION OPERATION
        Starts range(200000).toLocalIterator() in SESSION under OPERATION, reads one row,
        prints `STARTED` and sleeps: the test kills it (SIGKILL), leaving the execution
        behind with no client.

    python tests/python/connect_scenarios.py abandon-check PORT SESSION OPERATION
        After the server abandoned it: a reattach and a re-submitted ExecutePlan of
        OPERATION each get OPERATION_ABANDONED. Prints `CASE {json}` lines and
        `ABANDON DONE`.

    python tests/python/connect_scenarios.py drain-read PORT [ROWS [TOKEN]]
        Reads range(ROWS, default 5000000).toLocalIterator() at about 10 000 rows a second (over
        TLS with the token when TOKEN is given, the CA through GRPC_DEFAULT_SSL_ROOTS_FILE_PATH); prints
        `STARTED` after the first row. The test drains the server (SIGTERM, a short deadline)
        meanwhile: the read must fail with OPERATION_CANCELED (printed as `CASE {json}`
        with the rows read and the seconds from `STARTED`), and `spark.stop()` after it must
        return at once (`STOPPED {seconds}`), not retry against a stopped server.

    python tests/python/connect_scenarios.py chunked PORT ROWS ALLOW [PREFERRED]
        range(ROWS).toArrow() with result chunking allowed or not (ALLOW 1 or 0; connect
        §10) and PREFERRED as the client's preferred chunk size (bytes). Prints
        `CASE {json}`: the rows and whether they are 0..ROWS in order, the batches and chunks
        PySpark assembled (from its debug log), or the error's condition; then
        `CHUNKED DONE`.

    python tests/python/connect_scenarios.py admission PORT CLIENTS ROWS
        CLIENTS PySpark sessions submit range(ROWS).collect() 0.2 s apart, each from its own
        thread, against a server with an admission cap (connect §11). Prints one
        `CASE {json}` per client (its index, submit and first-result times, rows, error) and
        `ADMISSION DONE`.
    python tests/python/connect_scenarios.py artifacts PORT
        Raw AddArtifacts / ArtifactStatus requests whose answers Spark 4.3.0 and tether
        share: a single-chunk upload's summary, a bad CRC (`is_crc_successful` false, nothing
        kept), ArtifactStatus of a known and an unknown `cache/` name, names that leave the
        session's directory (INVALID_ARTIFACT_PATH), an overwrite with other bytes
        (ARTIFACT_ALREADY_EXISTS), a chunked upload of several chunks, chunking errors, a
        request with no payload, a session id that is no UUID, and the session released.
        Prints `CASE {json}` lines and `ARTIFACTS DONE`.

    python tests/python/connect_scenarios.py artifact-differences PORT
        The artifact cases where tether deliberately differs from Spark (names Spark keeps
        that tether refuses, a `cache/` name whose bytes have another SHA-256, a stream
        of which one artifact was refused, an empty stream): reported, not asserted.
        Prints `CASE {json}` lines and `ARTIFACT DIFFERENCES DONE`.

    python tests/python/connect_scenarios.py artifact-limits PORT SESSION_BYTES
        Against a tether server started with `--artifact-session-bytes SESSION_BYTES`: an
        upload over the limit (single and chunked) is refused with ARTIFACT_LIMIT_EXCEEDED
        and nothing of it is kept; one within it is kept. Prints `CASE {json}` lines and
        `ARTIFACT LIMITS DONE`.

    python tests/python/connect_scenarios.py artifacts-pyspark PORT
        PySpark's own uploads: `spark.addArtifacts(path, file=True)` (the server holds the
        file byte-exact: the same bytes again are accepted, one byte changed is refused),
        and `createDataFrame` of a dataset above `localRelationCacheThreshold`, whose
        `cache/<sha256>` artifacts ArtifactStatus then answers. Prints `CASE {json}` lines,
        then `HOLDING` and waits for a line on stdin before `spark.stop()` (so the caller
        can look at what the server holds), then `ARTIFACTS PYSPARK DONE`.

    python tests/python/connect_scenarios.py sql PORT
        What `spark.sql(query)` gets: raw ExecutePlan of `Command { sql_command { input } }`
        (input: `SQL { query, pos_arguments }` with a plan id), reattachable, answered with
        one `sql_command_result` whose relation is the input as sent (Spark 4.3.0 measured);
        then PySpark's `spark.sql(query, args)`, whose DataFrame plan is that relation.
        Prints `CASE {json}` lines (compared between servers by scripts/real_spark.py) and
        `SQL DONE`.

Exit status: 0 when every check passed, 1 (with a traceback) when one failed, 3 with a
message starting with "ENV:" when pyspark-client cannot be imported.
"""

import hashlib
import json
import sys
import time
import uuid
import zlib

from client_env import require

N = 200_000

(grpc, error_details_pb2, rpc_status, connect_errors, pb, pb_grpc, rel,
 connect_session) = require(
    "grpc", "google.rpc.error_details_pb2", "grpc_status.rpc_status",
    "pyspark.errors.exceptions.connect", "pyspark.sql.connect.proto.base_pb2",
    "pyspark.sql.connect.proto.base_pb2_grpc", "pyspark.sql.connect.proto.relations_pb2",
    "pyspark.sql.connect.session")
convert_exception = connect_errors.convert_exception
ConnectSession = connect_session.SparkSession

def stub(port):
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    return pb_grpc.SparkConnectServiceStub(channel)


def user(name):
    return pb.UserContext(user_id=name)


def range_plan(end):
    return pb.Plan(root=rel.Relation(range=rel.Range(start=0, end=end, step=1)))


def reattachable():
    return [pb.ExecutePlanRequest.RequestOption(
        reattach_options=pb.ReattachOptions(reattachable=True))]


def outcome(case, call):
    """Runs `call` (which consumes a whole RPC) and describes how it ended: `ok` with what it
    returned, or the error as a Spark client sees it."""
    try:
        result = call()
        return {"case": case, "code": "OK", "result": result}
    except grpc.RpcError as e:
        out = {"case": case, "code": e.code().name}
        status = rpc_status.from_call(e)
        info = None
        if status is not None:
            for detail in status.details:
                if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                    info = error_details_pb2.ErrorInfo()
                    detail.Unpack(info)
        if info is None:
            out["message"] = e.details()
            return out
        out["condition"] = info.metadata.get("errorClass")
        out["sql_state"] = info.metadata.get("sqlState")
        out["parameters"] = sorted(json.loads(info.metadata.get("messageParameters") or "{}"))
        out["reason"] = info.reason
        # Whether the server can answer FetchErrorDetails for it (connect §8.1).
        out["error_id"] = "errorId" in info.metadata
        converted = convert_exception(info, status.message, None, grpc_status_code=e.code())
        out["exception"] = type(converted).__name__
        return out


def report(case):
    print("CASE " + json.dumps(case, sort_keys=True), flush=True)
    return case


def expect(case, **want):
    got = {k: case.get(k) for k in want}
    if got != want:
        raise AssertionError(f"{case['case']}: got {case}, expected {want}")
    return case


def drain(responses):
    """Consumes a response stream; returns the ids of what it held."""
    return [r.response_id for r in responses]


def errors(port):
    s = stub(port)
    session = str(uuid.uuid4())
    a = user("tether-errors")
    # The session exists from its first RPC on (Config gets or creates it).
    s.Config(pb.ConfigRequest(session_id=session, user_context=a, operation=pb.ConfigRequest.Operation(
        get_option=pb.ConfigRequest.GetOption(keys=["spark.sql.session.timeZone"]))))

    unknown = str(uuid.uuid4())
    expect(report(outcome("reattach_unknown_operation", lambda: drain(s.ReattachExecute(
        pb.ReattachExecuteRequest(session_id=session, user_context=a, operation_id=unknown))))),
        code="INTERNAL", condition="INVALID_HANDLE.OPERATION_NOT_FOUND", sql_state="HY000",
        parameters=["handle"])

    # An active operation (not read to its end, so not released), then its id again.
    op = str(uuid.uuid4())
    first = s.ExecutePlan(pb.ExecutePlanRequest(
        session_id=session, user_context=a, operation_id=op, plan=range_plan(N),
        request_options=reattachable()))
    head = next(first)
    first.cancel()
    expect(report(outcome("execute_duplicate_other_plan", lambda: drain(s.ExecutePlan(
        pb.ExecutePlanRequest(session_id=session, user_context=a, operation_id=op,
                              plan=range_plan(10), request_options=reattachable()))))),
        code="INTERNAL", condition="INVALID_HANDLE.OPERATION_ALREADY_EXISTS", sql_state="HY000",
        parameters=["handle"])
    # The same plan again: a reattach from the start (Spark 4.0.1+, reattach spec §5.2).
    again = s.ExecutePlan(pb.ExecutePlanRequest(
        session_id=session, user_context=a, operation_id=op, plan=range_plan(N),
        request_options=reattachable()))
    same = next(again)
    again.cancel()
    if same.response_id != head.response_id:
        raise AssertionError(f"the same plan again must restart the stream: {same} vs {head}")
    report({"case": "execute_duplicate_same_plan", "code": "OK", "result": "reattached"})
    s.ReleaseExecute(pb.ReleaseExecuteRequest(
        session_id=session, user_context=a, operation_id=op,
        release_all=pb.ReleaseExecuteRequest.ReleaseAll()))

    expect(report(outcome("reattach_bad_operation_id", lambda: drain(s.ReattachExecute(
        pb.ReattachExecuteRequest(session_id=session, user_context=a,
                                  operation_id="not-a-uuid"))))),
        code="INTERNAL", condition="INVALID_HANDLE.OPERATION_NOT_FOUND", sql_state="HY000",
        parameters=["handle"])
    expect(report(outcome("execute_bad_operation_id", lambda: drain(s.ExecutePlan(
        pb.ExecutePlanRequest(session_id=session, user_context=a, operation_id="not-a-uuid",
                              plan=range_plan(3)))))),
        code="INTERNAL", condition="INVALID_HANDLE.FORMAT", sql_state="HY000",
        parameters=["handle"])
    expect(report(outcome("release_bad_operation_id", lambda: s.ReleaseExecute(
        pb.ReleaseExecuteRequest(session_id=session, user_context=a, operation_id="not-a-uuid",
                                 release_all=pb.ReleaseExecuteRequest.ReleaseAll())).operation_id)),
        code="OK", result="")
    expect(report(outcome("execute_empty_relation", lambda: drain(s.ExecutePlan(
        pb.ExecutePlanRequest(session_id=session, user_context=a,
                              plan=pb.Plan(root=rel.Relation())))))),
        code="INTERNAL", condition="CONNECT_INVALID_PLAN.INVALID_ONE_OF_FIELD_NOT_SET",
        sql_state="56K00", parameters=["fullName", "name"], exception="InvalidPlanInput")

    # A Config get of a key without a value.
    expect(report(outcome("config_get_unknown_key", lambda: list(s.Config(pb.ConfigRequest(
        session_id=session, user_context=a, operation=pb.ConfigRequest.Operation(
            get=pb.ConfigRequest.Get(keys=["tether.no.such.key"])))).pairs))),
        code="INTERNAL", condition="SQL_CONF_NOT_FOUND", sql_state="42K0I",
        parameters=["sqlConf"], exception="SparkNoSuchElementException")

    # Interrupt gets or creates its session: a brand-new one interrupts nothing.
    fresh = str(uuid.uuid4())
    expect(report(outcome("interrupt_new_session", lambda: list(s.Interrupt(pb.InterruptRequest(
        session_id=fresh, user_context=a,
        interrupt_type=pb.InterruptRequest.INTERRUPT_TYPE_ALL)).interrupted_ids))),
        code="OK", result=[])
    # A reattach in a session that does not exist.
    expect(report(outcome("reattach_unknown_session", lambda: drain(s.ReattachExecute(
        pb.ReattachExecuteRequest(session_id=str(uuid.uuid4()), user_context=a,
                                  operation_id=unknown))))),
        code="INTERNAL", condition="INVALID_HANDLE.SESSION_NOT_FOUND", sql_state="08003",
        parameters=["handle"])
    fetch_error_details(s, session, a)
    s.ReleaseSession(pb.ReleaseSessionRequest(session_id=session, user_context=a))
    # FetchErrorDetails gets its session as every RPC does: a released one is closed.
    expect(report(outcome("fetch_error_details_closed_session", lambda: describe(
        s.FetchErrorDetails(pb.FetchErrorDetailsRequest(
            session_id=session, user_context=a, error_id=str(uuid.uuid4())))))),
        code="INTERNAL", condition="INVALID_HANDLE.SESSION_CLOSED", sql_state="08003",
        error_id=False)
    print("ERRORS DONE", flush=True)


def config(port):
    s = stub(port)
    session, a = str(uuid.uuid4()), user("tether-config")
    token = "spark.connect.authenticate.token"
    Op, KV = pb.ConfigRequest.Operation, pb.KeyValue

    def conf(case, **operation):
        def call():
            answer = s.Config(pb.ConfigRequest(session_id=session, user_context=a,
                                               operation=Op(**operation)))
            pairs = [[p.key, p.value if p.HasField("value") else None] for p in answer.pairs]
            # GetAll's order is Spark's hash map's: no order to compare.
            return sorted(pairs) if "get_all" in operation else pairs
        return report(outcome(case, call))

    def absent(*keys):
        return [[k, None] for k in keys]

    expect(conf("config_set", set=pb.ConfigRequest.Set(pairs=[
        KV(key="spark.tether.a", value="1"), KV(key="spark.tether.b", value="2"),
        KV(key="spark.tether.my.password", value="hunter2"),
        KV(key="spark.tether.c", value="my Secret value")])), code="OK", result=[])
    expect(conf("config_get_all_prefix", get_all=pb.ConfigRequest.GetAll(
        prefix="spark.tether.")), code="OK", result=[["a", "1"], ["b", "2"]])
    expect(conf("config_get_all_prefix_without_dot", get_all=pb.ConfigRequest.GetAll(
        prefix="spark.tether")), code="OK", result=[[".a", "1"], [".b", "2"]])
    expect(conf("config_get_all_whole_key", get_all=pb.ConfigRequest.GetAll(
        prefix="spark.tether.a")), code="OK", result=[["", "1"]])
    expect(conf("config_get_all_no_match", get_all=pb.ConfigRequest.GetAll(
        prefix="tether.none.")), code="OK", result=[])
    expect(conf("config_get_redacted_key", get=pb.ConfigRequest.Get(
        keys=["spark.tether.a", "spark.tether.my.password"])),
        code="INTERNAL", condition="SQL_CONF_NOT_FOUND", sql_state="42K0I",
        parameters=["sqlConf"], exception="SparkNoSuchElementException")
    expect(conf("config_get_redacted_value", get=pb.ConfigRequest.Get(
        keys=["spark.tether.c"])), code="INTERNAL", condition="SQL_CONF_NOT_FOUND")
    expect(conf("config_get_option_redacted", get_option=pb.ConfigRequest.GetOption(
        keys=["spark.tether.my.password", "spark.tether.c", "spark.tether.a"])),
        code="OK", result=absent("spark.tether.my.password", "spark.tether.c")
        + [["spark.tether.a", "1"]])
    expect(conf("config_get_with_default_redacted", get_with_default=pb.ConfigRequest.GetWithDefault(
        pairs=[KV(key="spark.tether.my.password", value="d"),
               KV(key="spark.tether.my.password"), KV(key="spark.tether.a", value="z")])),
        code="OK", result=[["spark.tether.my.password", "d"],
                           ["spark.tether.my.password", None], ["spark.tether.a", "1"]])
    expect(conf("config_set_token", set=pb.ConfigRequest.Set(pairs=[
        KV(key="spark.tether.e", value="5"), KV(key=token, value="x"),
        KV(key="spark.tether.f", value="6")])),
        code="INTERNAL", condition="CANNOT_MODIFY_STATIC_CONFIG", sql_state="46110",
        parameters=["key"], exception="AnalysisException")
    # The pairs before the refused one were set.
    expect(conf("config_after_set_token", get_option=pb.ConfigRequest.GetOption(
        keys=["spark.tether.e", "spark.tether.f"])),
        code="OK", result=[["spark.tether.e", "5"], ["spark.tether.f", None]])
    expect(conf("config_unset_token", unset=pb.ConfigRequest.Unset(keys=[token])),
           code="INTERNAL", condition="CANNOT_MODIFY_STATIC_CONFIG")
    expect(conf("config_get_token", get=pb.ConfigRequest.Get(keys=[token])),
           code="INTERNAL", condition="SQL_CONF_NOT_FOUND")
    expect(conf("config_get_option_token", get_option=pb.ConfigRequest.GetOption(keys=[token])),
           code="OK", result=absent(token))
    expect(conf("config_is_modifiable_token", is_modifiable=pb.ConfigRequest.IsModifiable(
        keys=[token])), code="OK", result=[[token, "false"]])
    s.ReleaseSession(pb.ReleaseSessionRequest(session_id=session, user_context=a))
    print("CONFIG DONE", flush=True)


def describe(details):
    """What a FetchErrorDetails answer says, without the server's stack trace (Spark's is
    its JVM's; tether has none, connect §8.1)."""
    return {
        "root_error_idx": details.root_error_idx if details.HasField("root_error_idx") else None,
        "bytes": 0 if details.ByteSize() == 0 else "some",
        "errors": [{
            "classes": list(e.error_type_hierarchy),
            "message": e.message,
            "cause_idx": e.cause_idx if e.HasField("cause_idx") else None,
            "condition": e.spark_throwable.error_class
            if e.spark_throwable.HasField("error_class") else None,
            "parameters": dict(e.spark_throwable.message_parameters),
            "sql_state": e.spark_throwable.sql_state
            if e.spark_throwable.HasField("sql_state") else None,
        } for e in details.errors],
    }


def fetch_error_details(s, session, a):
    """FetchErrorDetails (connect §8): an unknown id (the empty answer, no root_error_idx);
    the details of an RPC's error in a live session, once; a session id that is no UUID."""
    def fetch(error_id, session_id=session):
        return describe(s.FetchErrorDetails(pb.FetchErrorDetailsRequest(
            session_id=session_id, user_context=a, error_id=error_id)))

    expect(report(outcome("fetch_error_details_unknown_id", lambda: fetch(str(uuid.uuid4())))),
           code="OK", result={"root_error_idx": None, "bytes": 0, "errors": []})
    expect(report(outcome("fetch_error_details_not_a_uuid", lambda: fetch("not-a-uuid"))),
           code="OK", result={"root_error_idx": None, "bytes": 0, "errors": []})
    try:
        s.Config(pb.ConfigRequest(session_id=session, user_context=a,
                                  operation=pb.ConfigRequest.Operation(
                                      get=pb.ConfigRequest.Get(keys=["tether.no.such.key"]))))
        raise AssertionError("a Config get of an unknown key must fail")
    except grpc.RpcError as e:
        status = rpc_status.from_call(e)
        info = error_details_pb2.ErrorInfo()
        next(d for d in status.details if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR)).Unpack(info)
        error_id = info.metadata["errorId"]
    key = '"tether.no.such.key"'
    expect(report(outcome("fetch_error_details_of_an_rpc_error", lambda: fetch(error_id))),
           code="OK", result={"root_error_idx": 0, "bytes": "some", "errors": [{
               "classes": ["org.apache.spark.SparkNoSuchElementException",
                           "java.util.NoSuchElementException", "java.lang.RuntimeException",
                           "java.lang.Exception", "java.lang.Throwable", "java.lang.Object"],
               "message": f"[SQL_CONF_NOT_FOUND] The SQL config {key} cannot be found. "
                          "Please verify that the config exists. SQLSTATE: 42K0I",
               "cause_idx": None, "condition": "SQL_CONF_NOT_FOUND",
               "parameters": {"sqlConf": key}, "sql_state": "42K0I"}]})
    expect(report(outcome("fetch_error_details_twice", lambda: fetch(error_id))),
           code="OK", result={"root_error_idx": None, "bytes": 0, "errors": []})
    expect(report(outcome("fetch_error_details_bad_session_id",
                          lambda: fetch(str(uuid.uuid4()), session_id="not-a-uuid"))),
           code="INTERNAL", condition="INVALID_HANDLE.FORMAT", sql_state="HY000",
           error_id=False)


def differences(port):
    """The cases where tether deliberately answers otherwise than Spark (the table in
    tether::spark::connect): reported, not asserted; scripts/real_spark.py holds each
    server to its documented answer."""
    s = stub(port)
    session = str(uuid.uuid4())
    a = user("tether-differences")
    # An upper-case operation id: tether normalises it everywhere, Spark only in ExecutePlan.
    upper = str(uuid.uuid4()).upper()
    stream = s.ExecutePlan(pb.ExecutePlanRequest(
        session_id=session, user_context=a, operation_id=upper, plan=range_plan(N),
        request_options=reattachable()))
    head = next(stream)
    stream.cancel()
    report(outcome("reattach_upper_case_operation_id", lambda: len(drain(s.ReattachExecute(
        pb.ReattachExecuteRequest(session_id=session, user_context=a, operation_id=upper,
                                  last_response_id=head.response_id)))) > 0))
    s.ReleaseExecute(pb.ReleaseExecuteRequest(
        session_id=session, user_context=a, operation_id=upper.lower(),
        release_all=pb.ReleaseExecuteRequest.ReleaseAll()))
    # ReleaseAll after an Interrupt of a running execution (10 000 000 rows: more than
    # tether's unsent bound, so it is still running when the interrupt comes).
    op = str(uuid.uuid4())
    stream = s.ExecutePlan(pb.ExecutePlanRequest(
        session_id=session, user_context=a, operation_id=op, plan=range_plan(10_000_000),
        request_options=reattachable()))
    next(stream)
    stream.cancel()
    report(outcome("interrupt_running_operation", lambda: list(s.Interrupt(pb.InterruptRequest(
        session_id=session, user_context=a, operation_id=op,
        interrupt_type=pb.InterruptRequest.INTERRUPT_TYPE_OPERATION_ID)).interrupted_ids)
        == [op]))
    report(outcome("release_all_after_interrupt", lambda: s.ReleaseExecute(
        pb.ReleaseExecuteRequest(session_id=session, user_context=a, operation_id=op,
                                 release_all=pb.ReleaseExecuteRequest.ReleaseAll())
    ).operation_id == op))
    s.ReleaseSession(pb.ReleaseSessionRequest(session_id=session, user_context=a))
    print("DIFFERENCES DONE", flush=True)


class FixedOperation(ConnectSession.Hook):
    """Gives the next ExecutePlan the operation id in OPERATION (PySpark keeps an id the
    request already has)."""

    OPERATION = None

    def __init__(self, _session):
        pass

    def on_execute_plan(self, request):
        if FixedOperation.OPERATION is not None:
            request.operation_id = FixedOperation.OPERATION
            FixedOperation.OPERATION = None
        return request


def pyspark_session(port, user_id, session_id, extra=""):
    url = f"sc://localhost:{port}/;user_id={user_id};session_id={session_id}{extra}"
    return ConnectSession.builder.remote(url)._registerHook(FixedOperation).create()


def isolation(port):
    session = str(uuid.uuid4())
    op = str(uuid.uuid4())
    spark = pyspark_session(port, "tether-user-a", session)
    FixedOperation.OPERATION = op
    rows = spark.range(N).toLocalIterator()
    got = [next(rows).id]

    # User B, same session id: its own session, where A's operation does not exist.
    s = stub(port)
    b = user("tether-user-b")
    s.Config(pb.ConfigRequest(session_id=session, user_context=b, operation=pb.ConfigRequest.Operation(
        get_option=pb.ConfigRequest.GetOption(keys=["spark.sql.session.timeZone"]))))
    expect(report(outcome("other_user_reattach", lambda: drain(s.ReattachExecute(
        pb.ReattachExecuteRequest(session_id=session, user_context=b, operation_id=op))))),
        code="INTERNAL", condition="INVALID_HANDLE.OPERATION_NOT_FOUND")
    expect(report(outcome("other_user_release", lambda: s.ReleaseExecute(
        pb.ReleaseExecuteRequest(session_id=session, user_context=b, operation_id=op,
                                 release_all=pb.ReleaseExecuteRequest.ReleaseAll())).operation_id)),
        code="OK")
    expect(report(outcome("other_user_interrupt_operation", lambda: list(s.Interrupt(
        pb.InterruptRequest(session_id=session, user_context=b, operation_id=op,
                            interrupt_type=pb.InterruptRequest.INTERRUPT_TYPE_OPERATION_ID)
    ).interrupted_ids))), code="OK", result=[])
    expect(report(outcome("other_user_interrupt_all", lambda: list(s.Interrupt(
        pb.InterruptRequest(session_id=session, user_context=b,
                            interrupt_type=pb.InterruptRequest.INTERRUPT_TYPE_ALL)
    ).interrupted_ids))), code="OK", result=[])

    # A's stream is unaffected: every row, once, in order.
    got.extend(r.id for r in rows)
    if got != list(range(N)):
        raise AssertionError(f"user A: {len(got)} rows, first wrong at "
                             f"{next((i for i, v in enumerate(got) if v != i), None)}")
    spark.stop()
    print("ISOLATION OK", flush=True)


def abandon_start(port, session, op):
    spark = pyspark_session(port, "tether-abandon", session)
    FixedOperation.OPERATION = op
    rows = spark.range(N).toLocalIterator()
    first = next(rows).id
    assert first == 0, first
    print("STARTED", flush=True)
    time.sleep(3600)


def abandon_check(port, session, op):
    s = stub(port)
    u = user("tether-abandon")
    expect(report(outcome("reattach_abandoned", lambda: drain(s.ReattachExecute(
        pb.ReattachExecuteRequest(session_id=session, user_context=u, operation_id=op))))),
        code="INTERNAL", condition="INVALID_HANDLE.OPERATION_ABANDONED", sql_state="HY000",
        parameters=["handle"])
    expect(report(outcome("execute_abandoned", lambda: drain(s.ExecutePlan(
        pb.ExecutePlanRequest(session_id=session, user_context=u, operation_id=op,
                              plan=range_plan(N), request_options=reattachable()))))),
        code="INTERNAL", condition="INVALID_HANDLE.OPERATION_ABANDONED", sql_state="HY000")
    print("ABANDON DONE", flush=True)


def drain_read(port, total=5_000_000, token=None):
    extra = f";use_ssl=true;token={token}" if token else ""
    spark = pyspark_session(port, "tether-drain", str(uuid.uuid4()), extra)
    rows = spark.range(total).toLocalIterator()
    assert next(rows).id == 0
    started = time.monotonic()
    print("STARTED", flush=True)
    read = 1
    try:
        for row in rows:
            assert row.id == read, (row.id, read)
            read += 1
            if read % 100 == 0:
                time.sleep(0.01)
    except Exception as e:  # noqa: BLE001 (the case reports whatever PySpark raised)
        condition = getattr(e, "getErrorClass", lambda: None)()
        print("CASE " + json.dumps({
            "case": "drain_deadline", "rows": read, "condition": condition,
            "exception": type(e).__name__, "seconds": round(time.monotonic() - started, 2),
            "message": str(e)[:200]}), flush=True)
        if condition != "OPERATION_CANCELED":
            raise AssertionError(f"expected OPERATION_CANCELED, got {type(e).__name__}: {e}")
    else:
        raise AssertionError(f"read all {read} rows: the drain's deadline canceled nothing")
    stopping = time.monotonic()
    spark.stop()
    print(f"STOPPED {time.monotonic() - stopping:.2f}", flush=True)


class Chunks:
    """The `Received arrow batch …` debug lines of pyspark-client's logger: one per
    response, naming its chunk index and the batch's number of chunks."""

    def __init__(self):
        import logging
        self.seen = []
        chunks = self

        class Handler(logging.Handler):
            def emit(self, record):
                # pyspark's logger formats its own messages (f-strings), and some of them
                # hold a `%` with no arguments: read the text as it was given.
                text = str(record.msg)
                if text.startswith("Received arrow batch"):
                    fields = dict(p.split("=", 1) for p in text.replace("Number of chunks in batch",
                                  "chunks").replace("Chunk index", "index").split() if "=" in p)
                    chunks.seen.append((int(fields["index"]), int(fields["chunks"])))

        # Off unless SPARK_CONNECT_LOG_LEVEL is set (pyspark.sql.connect.logging); its own
        # stderr handler is replaced.
        log = logging.getLogger("pyspark.sql.connect.logging")
        log.disabled = False
        log.setLevel(logging.DEBUG)
        log.handlers = [Handler()]


def chunked(port, total, allow, preferred):
    import numpy
    chunks = Chunks()
    spark = pyspark_session(port, "tether-chunks", str(uuid.uuid4()))
    spark.client._allow_arrow_batch_chunking = allow
    spark.client._preferred_arrow_chunk_size = preferred
    started = time.monotonic()
    case = {"case": "chunked", "allow": allow, "preferred": preferred}
    try:
        table = spark.range(total).toArrow()
    except Exception as e:  # noqa: BLE001 (the case reports whatever PySpark raised)
        case.update(condition=getattr(e, "getCondition", lambda: None)(),
                    exception=type(e).__name__, message=str(e)[:300])
    else:
        ids = table.column("id").to_numpy()
        case.update(rows=len(ids),
                    in_order=bool(len(ids) == total and (ids == numpy.arange(total)).all()),
                    batches=sum(1 for index, _ in chunks.seen if index == 0),
                    responses=len(chunks.seen),
                    most_chunks=max((n for _, n in chunks.seen), default=0),
                    seconds=round(time.monotonic() - started, 2))
    print("CASE " + json.dumps(case), flush=True)
    spark.stop()
    print("CHUNKED DONE", flush=True)


def admission(port, clients, total):
    import threading
    started = time.monotonic()
    sessions = [pyspark_session(port, f"tether-admission-{i}", str(uuid.uuid4()))
                for i in range(clients)]
    cases = [None] * clients

    def run(i):
        case = {"case": "admission", "client": i,
                "submitted": round(time.monotonic() - started, 3)}
        try:
            rows = sessions[i].range(total).collect()
            case.update(rows=len(rows), in_order=[r.id for r in rows] == list(range(total)),
                        done=round(time.monotonic() - started, 3))
        except Exception as e:  # noqa: BLE001 (the case reports whatever PySpark raised)
            case.update(condition=getattr(e, "getCondition", lambda: None)(),
                        exception=type(e).__name__, message=str(e)[:300])
        cases[i] = case

    threads = []
    for i in range(clients):
        t = threading.Thread(target=run, args=(i,))
        t.start()
        threads.append(t)
        time.sleep(0.2)
    for t in threads:
        t.join()
    for case in cases:
        print("CASE " + json.dumps(case), flush=True)
    for s in sessions:
        s.stop()
    print("ADMISSION DONE", flush=True)
# ---------------------------------------------------------------------------------------------
# Artifacts
# ---------------------------------------------------------------------------------------------

# A parent segment, spelled apart: the repository's path check reads every `../`.
UP = ".."


def sha256(data):
    return hashlib.sha256(data).hexdigest()


class Artifacts:
    """Raw AddArtifacts / ArtifactStatus requests in one session."""

    def __init__(self, port, user_id="tether-artifacts", session=None):
        self.stub = stub(port)
        self.session = session or str(uuid.uuid4())
        self.user = user(user_id)

    def chunk(self, data, crc=None):
        return pb.AddArtifactsRequest.ArtifactChunk(
            data=data, crc=zlib.crc32(data) if crc is None else crc)

    def request(self, **payload):
        return pb.AddArtifactsRequest(session_id=self.session, user_context=self.user, **payload)

    def batch(self, *artifacts):
        """One batch request of (name, data[, crc]) artifacts."""
        return self.request(batch=pb.AddArtifactsRequest.Batch(artifacts=[
            pb.AddArtifactsRequest.SingleChunkArtifact(name=a[0], data=self.chunk(*a[1:]))
            for a in artifacts]))

    def chunked(self, name, parts, num_chunks=None, total=None, bad=None):
        """The requests of a chunked artifact; the chunk at index `bad` has a wrong CRC."""
        crc = lambda i: 7 if i == bad else None  # noqa: E731
        first = self.request(begin_chunk=pb.AddArtifactsRequest.BeginChunkedArtifact(
            name=name, total_bytes=sum(map(len, parts)) if total is None else total,
            num_chunks=len(parts) if num_chunks is None else num_chunks,
            initial_chunk=self.chunk(parts[0], crc(0))))
        return [first] + [self.request(chunk=self.chunk(p, crc(i)))
                          for i, p in enumerate(parts[1:], 1)]

    def add(self, requests):
        """Sends the requests as one stream; the summaries as [name, is_crc_successful]."""
        response = self.stub.AddArtifacts(iter(requests))
        return [[a.name, a.is_crc_successful] for a in response.artifacts]

    def status(self, *names):
        response = self.stub.ArtifactStatus(pb.ArtifactStatusesRequest(
            session_id=self.session, user_context=self.user, names=list(names)))
        return {name: response.statuses[name].exists for name in names
                if name in response.statuses}

    def release(self):
        self.stub.ReleaseSession(pb.ReleaseSessionRequest(
            session_id=self.session, user_context=self.user))


def artifacts(port):
    a = Artifacts(port)
    data = b"hello artifact"
    good = "cache/" + sha256(data)
    expect(report(outcome("artifact_single_chunk", lambda: a.add([a.batch((good, data))]))),
           code="OK", result=[[good, True]])
    unknown = "cache/" + sha256(b"never sent")
    expect(report(outcome("artifact_status_known_and_unknown", lambda: a.status(good, unknown))),
           code="OK", result={good: True, unknown: False})
    bad = "cache/" + sha256(b"bad crc")
    expect(report(outcome("artifact_bad_crc", lambda: a.add([a.batch((bad, b"bad crc", 123))]))),
           code="OK", result=[[bad, False]])
    expect(report(outcome("artifact_bad_crc_not_kept", lambda: a.status(bad))),
           code="OK", result={bad: False})
    expect(report(outcome("artifact_batch_one_bad_crc", lambda: a.add([a.batch(
        ("files/c1.txt", b"c1"), ("files/c2.txt", b"c2", 5))]))),
        code="OK", result=[["files/c1.txt", True], ["files/c2.txt", False]])
    # ArtifactStatus answers `cache/` names only: a kept file is not reported.
    expect(report(outcome("artifact_status_of_a_file", lambda: a.status("files/c1.txt"))),
           code="OK", result={"files/c1.txt": False})
    for name in [f"{UP}/x", "/abs", f"files/{UP}/{UP}/x", ""]:
        expect(report(outcome(f"artifact_name {name!r}", lambda: a.add([a.batch((name, b"q"))]))),
               code="INTERNAL", condition="INVALID_ARTIFACT_PATH", sql_state="22023",
               parameters=["name"])
    expect(report(outcome("artifact_same_bytes_again", lambda: a.add([
        a.batch(("files/c1.txt", b"c1"))]))), code="OK", result=[["files/c1.txt", True]])
    expect(report(outcome("artifact_other_bytes_same_name", lambda: a.add([
        a.batch(("files/c1.txt", b"changed"))]))),
        code="INTERNAL", condition="ARTIFACT_ALREADY_EXISTS", sql_state="42713",
        parameters=["normalizedRemoteRelativePath"])
    big = bytes(range(256)) * 400  # 102 400 bytes, four chunks of 32 KiB (PySpark's size)
    parts = [big[i:i + 32768] for i in range(0, len(big), 32768)]
    chunked = "cache/" + sha256(big)
    expect(report(outcome("artifact_chunked", lambda: a.add(a.chunked(chunked, parts)))),
           code="OK", result=[[chunked, True]])
    expect(report(outcome("artifact_chunked_status", lambda: a.status(chunked))),
           code="OK", result={chunked: True})
    other = bytes(reversed(big))
    other_parts = [other[i:i + 32768] for i in range(0, len(other), 32768)]
    bad_chunked = "cache/" + sha256(other)
    expect(report(outcome("artifact_chunked_bad_crc", lambda: a.add(
        a.chunked(bad_chunked, other_parts, bad=2)))), code="OK", result=[[bad_chunked, False]])
    expect(report(outcome("artifact_chunked_bad_crc_not_kept", lambda: a.status(bad_chunked))),
           code="OK", result={bad_chunked: False})
    for case, requests in [
        ("artifact_chunks_missing", a.chunked("files/m", parts[:2], num_chunks=3, total=len(big))),
        ("artifact_chunks_in_excess", a.chunked("files/e", parts[:3], num_chunks=2,
                                                 total=2 * 32768)),
        ("artifact_chunk_without_begin", [a.request(chunk=a.chunk(b"x"))]),
        ("artifact_begin_inside_chunked", a.chunked("files/b1", parts[:2], num_chunks=3)
         + a.chunked("files/b2", parts[:1])),
    ]:
        expect(report(outcome(case, lambda: a.add(requests))), code="INTERNAL", condition=None,
               exception="IllegalArgumentException")
    expect(report(outcome("artifact_no_payload", lambda: a.add([a.request()]))),
           code="INTERNAL", condition=None)
    bad_session = Artifacts(port, session="not-a-uuid")
    expect(report(outcome("artifact_add_bad_session", lambda: bad_session.add(
        [bad_session.batch(("files/z", b"z"))]))),
        code="INTERNAL", condition="INVALID_HANDLE.FORMAT")
    expect(report(outcome("artifact_status_bad_session", lambda: bad_session.status(good))),
           code="INTERNAL", condition="INVALID_HANDLE.FORMAT")
    a.release()
    expect(report(outcome("artifact_status_after_release", lambda: a.status(good))),
           code="INTERNAL", condition="INVALID_HANDLE.SESSION_CLOSED")
    print("ARTIFACTS DONE", flush=True)


def artifact_differences(port):
    """tether::spark::connect's table of differences, the artifact rows: reported, not
    asserted (scripts/real_spark.py holds each server to its documented answer)."""
    a = Artifacts(port, "tether-artifact-differences")
    for name in ["files//x", "files\\x", "unknown/x", "x", f"files/a/{UP}/b", "./files/x",
                 "a\0b", "cache/notahash"]:
        report(outcome(f"artifact_name {name!r}", lambda: a.add([a.batch((name, b"q"))])))
    wrong = "cache/" + "1" * 64
    report(outcome("artifact_wrong_hash", lambda: a.add([a.batch((wrong, b"other"))])))
    # A request whose second artifact is refused at the end (other bytes under a kept
    # name): Spark keeps the first, tether neither.
    a.add([a.batch(("files/kept.txt", b"kept"))])
    first = "cache/" + sha256(b"first of a refused request")
    refused = outcome("artifact_refused_request", lambda: a.add([a.batch(
        (first, b"first of a refused request"), ("files/kept.txt", b"other"))]))
    refused["first_kept"] = a.status(first)[first]
    report(refused)
    # A refused name after a good artifact in the same stream: Spark keeps the good one,
    # tether nothing of the stream.
    before = "cache/" + sha256(b"before the bad name")
    bad_name = outcome("artifact_bad_name_after_a_good_one", lambda: a.add([
        a.batch((before, b"before the bad name")), a.batch((f"{UP}/y", b"y"))]))
    bad_name["first_kept"] = a.status(before)[before]
    report(bad_name)
    report(outcome("artifact_empty_stream", lambda: a.add([])))
    a.release()
    print("ARTIFACT DIFFERENCES DONE", flush=True)


def artifact_limits(port, limit):
    a = Artifacts(port, "tether-artifact-limits")
    over = bytes(limit + 1)
    name = "cache/" + sha256(over)
    expect(report(outcome("artifact_over_session_limit", lambda: a.add(
        [a.batch((name, over))]))), code="INTERNAL", condition="ARTIFACT_LIMIT_EXCEEDED")
    expect(report(outcome("artifact_over_limit_not_kept", lambda: a.status(name))),
           code="OK", result={name: False})
    parts = [over[i:i + 1000] for i in range(0, len(over), 1000)]
    # Refused at the begin_chunk, which announces the total: before any chunk is buffered.
    expect(report(outcome("artifact_chunked_over_session_limit", lambda: a.add(
        a.chunked(name, parts)))), code="INTERNAL", condition="ARTIFACT_LIMIT_EXCEEDED")
    within = bytes(limit // 2)
    kept = "cache/" + sha256(within)
    expect(report(outcome("artifact_within_limit", lambda: a.add([a.batch((kept, within))]))),
           code="OK", result=[[kept, True]])
    # What is kept counts: the same size again would pass the limit.
    again = bytes([1]) * (limit // 2 + 1)
    expect(report(outcome("artifact_kept_bytes_count", lambda: a.add(
        [a.batch(("cache/" + sha256(again), again))]))),
        code="INTERNAL", condition="ARTIFACT_LIMIT_EXCEEDED")
    a.release()
    print("ARTIFACT LIMITS DONE", flush=True)


def artifacts_pyspark(port):
    import os
    import tempfile
    session_id = str(uuid.uuid4())
    spark = pyspark_session(port, "tether-artifacts-pyspark", session_id)
    payload = bytes(range(256)) * 300 + b"tail"  # 76 804 bytes: a chunked upload
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "data.bin")
        with open(path, "wb") as f:
            f.write(payload)
        spark.addArtifacts(path, file=True)
    # The server holds it byte-exact: the same bytes under its name are accepted again,
    # one byte changed is refused (ARTIFACT_ALREADY_EXISTS).
    a = Artifacts(port, "tether-artifacts-pyspark", session_id)
    expect(report(outcome("pyspark_file_same_bytes", lambda: a.add(
        a.chunked("files/data.bin", [payload[i:i + 32768]
                                     for i in range(0, len(payload), 32768)])))),
        code="OK", result=[["files/data.bin", True]])
    changed = payload[:-1] + b"!"
    expect(report(outcome("pyspark_file_other_bytes", lambda: a.add(
        a.chunked("files/data.bin", [changed[i:i + 32768]
                                     for i in range(0, len(changed), 32768)])))),
        code="INTERNAL", condition="ARTIFACT_ALREADY_EXISTS")
    # createDataFrame of a dataset above the threshold uploads it as cache/ artifacts and
    # sends a ChunkedCachedLocalRelation naming their hashes.
    spark.conf.set("spark.sql.session.localRelationCacheThreshold", "1024")
    from pyspark.sql.types import LongType, StringType, StructField, StructType
    schema = StructType([StructField("id", LongType()), StructField("name", StringType())])
    df = spark.createDataFrame([(i, f"row {i}") for i in range(5000)], schema)
    plan = df._plan
    hashes = list(getattr(plan, "_data_hashes", []))
    schema_hash = getattr(plan, "_schema_hash", None)
    names = ["cache/" + h for h in hashes + ([schema_hash] if schema_hash else [])]
    if not hashes:
        raise AssertionError(f"createDataFrame did not cache its data: {type(plan).__name__}")
    expect(report(outcome("pyspark_cached_relation_status", lambda: all(a.status(*names).values())
                          and len(a.status(*names)) == len(names))), code="OK", result=True)
    report({"case": "pyspark_cached_relation", "code": "OK", "result": len(names)})
    # The caller looks at what the server holds, then lets the session go.
    print("HOLDING", flush=True)
    sys.stdin.readline()
    spark.stop()
    print("ARTIFACTS PYSPARK DONE", flush=True)
OPERATION_STATE = None


def state_name(value):
    global OPERATION_STATE
    if OPERATION_STATE is None:
        OPERATION_STATE = pb.GetStatusResponse.OperationStatus.OperationState
    return OPERATION_STATE.Name(value)


def read_to_end(s, session, who, op, plan):
    """Runs a reattachable ExecutePlan of `plan` under `op` and reads it to its end,
    reattaching after every stream the server rotates; returns the error code that ended
    it, or "OK" after ResultComplete."""
    last = None
    responses = s.ExecutePlan(pb.ExecutePlanRequest(
        session_id=session, user_context=who, operation_id=op, plan=plan,
        request_options=reattachable()))
    try:
        while True:
            for r in responses:
                last = r.response_id
                if r.HasField("result_complete"):
                    return "OK"
            request = pb.ReattachExecuteRequest(session_id=session, user_context=who,
                                                operation_id=op)
            if last is not None:
                request.last_response_id = last
            responses = s.ReattachExecute(request)
    except grpc.RpcError as e:
        return e.code().name


def statuses(s, session, who, ids=None):
    request = pb.GetStatusRequest(session_id=session, user_context=who)
    if ids is not None:
        request.operation_status.CopyFrom(
            pb.GetStatusRequest.OperationStatusRequest(operation_ids=ids))
    return [(o.operation_id, state_name(o.state))
            for o in s.GetStatus(request).operation_statuses]


def settled(s, session, who, op, final):
    """Polls GetStatus of `op` for up to 10 s until its state is in `final`; fails if the
    state ever goes back to running after it left it. Returns the last state."""
    seen = []
    deadline = time.monotonic() + 10
    while True:
        [(_, state)] = statuses(s, session, who, [op])
        if not seen or seen[-1] != state:
            seen.append(state)
        if state in final or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if "OPERATION_STATE_RUNNING" in seen[1:] and seen[0] != "OPERATION_STATE_RUNNING":
        raise AssertionError(f"{op}: back to running: {seen}")
    for i, state in enumerate(seen[1:], 1):
        if state == "OPERATION_STATE_RUNNING" and seen[i - 1] != "OPERATION_STATE_RUNNING":
            raise AssertionError(f"{op}: back to running: {seen}")
    return state


def sessions(port):
    s = stub(port)
    who = user("tether-sessions")
    source = str(uuid.uuid4())
    config_set(s, source, who, "tether.clone.key", "v1")

    def clone(session, target=None, observed=None):
        request = pb.CloneSessionRequest(session_id=session, user_context=who)
        if target is not None:
            request.new_session_id = target
        if observed is not None:
            request.client_observed_server_side_session_id = observed
        response = s.CloneSession(request)
        return {"source_echoed": response.session_id == session,
                "target_as_given": target in (None, "") or response.new_session_id == target,
                "new_server_side_differs":
                    response.new_server_side_session_id != response.server_side_session_id}

    def absent(session):
        return outcome("", lambda: statuses(s, session, who))["condition"]

    unknown = str(uuid.uuid4())
    target = str(uuid.uuid4())
    expect(report(outcome("clone_unknown_source", lambda: clone(unknown, target))),
           code="INTERNAL", condition="INVALID_HANDLE.SESSION_NOT_FOUND", sql_state="08003",
           parameters=["handle"])
    if absent(target) != "INVALID_HANDLE.SESSION_NOT_FOUND":
        raise AssertionError("a refused clone created its target")
    expect(report(outcome("clone_malformed_source", lambda: clone("not-a-uuid"))),
           code="INTERNAL", condition="INVALID_HANDLE.SESSION_NOT_FOUND", sql_state="08003")
    expect(report(outcome("clone_malformed_target", lambda: clone(source, "not-a-uuid"))),
           code="INTERNAL", condition="INVALID_CLONE_SESSION_REQUEST.TARGET_SESSION_ID_FORMAT",
           sql_state="42K04", parameters=["targetSessionId"])
    expect(report(outcome("clone_onto_itself", lambda: clone(source, source))),
           code="INTERNAL",
           condition="INVALID_CLONE_SESSION_REQUEST.TARGET_SESSION_ID_ALREADY_EXISTS",
           sql_state="42K04", parameters=["targetSessionId"])
    expect(report(outcome("clone_wrong_observed", lambda: clone(
        source, str(uuid.uuid4()), str(uuid.uuid4())))),
           code="INTERNAL", condition="INVALID_HANDLE.SESSION_CHANGED", sql_state="08003")
    expect(report(outcome("clone_given_target", lambda: clone(source, target))),
           code="OK", result={"source_echoed": True, "target_as_given": True,
                              "new_server_side_differs": True})
    expect(report(outcome("clone_generated_target", lambda: clone(source, ""))), code="OK")
    expect(report(outcome("clone_taken_target", lambda: clone(source, target))),
           code="INTERNAL",
           condition="INVALID_CLONE_SESSION_REQUEST.TARGET_SESSION_ID_ALREADY_EXISTS",
           sql_state="42K04", parameters=["targetSessionId"])
    expect(report(outcome("clone_sees_source_conf", lambda: config_get(
        s, target, who, "tether.clone.key"))), code="OK", result="v1")
    closed = str(uuid.uuid4())
    config_set(s, closed, who, "tether.clone.key", "closed")
    s.ReleaseSession(pb.ReleaseSessionRequest(session_id=closed, user_context=who))
    expect(report(outcome("clone_closed_source", lambda: clone(closed))),
           code="INTERNAL", condition="INVALID_HANDLE.SESSION_CLOSED", sql_state="08003")
    expect(report(outcome("clone_onto_closed", lambda: clone(source, closed))),
           code="INTERNAL",
           condition="INVALID_CLONE_SESSION_REQUEST.TARGET_SESSION_ID_ALREADY_CLOSED",
           sql_state="42K04", parameters=["targetSessionId"])

    # GetStatus never creates a session.
    expect(report(outcome("status_unknown_session", lambda: statuses(s, unknown, who, []))),
           code="INTERNAL", condition="INVALID_HANDLE.SESSION_NOT_FOUND", sql_state="08003",
           parameters=["handle"])
    expect(report(outcome("status_unknown_session_again", lambda: statuses(s, unknown, who))),
           code="INTERNAL", condition="INVALID_HANDLE.SESSION_NOT_FOUND")
    expect(report(outcome("status_malformed_session", lambda: statuses(s, "x", who))),
           code="INTERNAL", condition="INVALID_HANDLE.SESSION_NOT_FOUND")
    expect(report(outcome("status_closed_session", lambda: statuses(s, closed, who))),
           code="INTERNAL", condition="INVALID_HANDLE.SESSION_CLOSED", sql_state="08003")
    expect(report(outcome("status_without_request", lambda: statuses(s, source, who))),
           code="OK", result=[])
    expect(report(outcome("status_of_no_operations", lambda: statuses(s, source, who, []))),
           code="OK", result=[])
    odd = str(uuid.uuid4())
    expect(report(outcome("status_unknown_ids", lambda: [
        state for _, state in statuses(s, source, who, [odd, "not-a-uuid", odd])])),
           code="OK", result=["OPERATION_STATE_UNKNOWN", "OPERATION_STATE_UNKNOWN"])

    # An operation through its life: running, then interrupted.
    running = str(uuid.uuid4())
    stream = s.ExecutePlan(pb.ExecutePlanRequest(
        session_id=source, user_context=who, operation_id=running, plan=range_plan(10**12),
        request_options=reattachable()))
    next(stream)
    expect(report(outcome("status_running", lambda: statuses(s, source, who, [running])[0][1])),
           code="OK", result="OPERATION_STATE_RUNNING")
    s.Interrupt(pb.InterruptRequest(
        session_id=source, user_context=who, operation_id=running,
        interrupt_type=pb.InterruptRequest.INTERRUPT_TYPE_OPERATION_ID))
    # Read to its end (a rotated stream ends without the error; the state is polled below).
    drain_error(stream)
    expect(report(outcome("status_interrupted", lambda: settled(
        s, source, who, running, {"OPERATION_STATE_CANCELLED"}))),
           code="OK", result="OPERATION_STATE_CANCELLED")
    s.ReleaseExecute(pb.ReleaseExecuteRequest(
        session_id=source, user_context=who, operation_id=running,
        release_all=pb.ReleaseExecuteRequest.ReleaseAll()))
    expect(report(outcome("status_interrupted_released", lambda: settled(
        s, source, who, running, {"OPERATION_STATE_CANCELLED"}))),
           code="OK", result="OPERATION_STATE_CANCELLED")

    # Finished: terminating while registered, succeeded once released.
    finished = str(uuid.uuid4())
    if read_to_end(s, source, who, finished, range_plan(10)) != "OK":
        raise AssertionError("range(10) did not complete")
    expect(report(outcome("status_finished_unreleased", lambda: settled(
        s, source, who, finished, {"OPERATION_STATE_TERMINATING"}))),
           code="OK", result="OPERATION_STATE_TERMINATING")
    s.ReleaseExecute(pb.ReleaseExecuteRequest(
        session_id=source, user_context=who, operation_id=finished,
        release_all=pb.ReleaseExecuteRequest.ReleaseAll()))
    expect(report(outcome("status_finished_released", lambda: settled(
        s, source, who, finished, {"OPERATION_STATE_SUCCEEDED"}))),
           code="OK", result="OPERATION_STATE_SUCCEEDED")

    # Failed: a non-reattachable execution is removed at its end; a reattachable one stays.
    # Spark 4.3.0 under load can close such an execution as CANCELLED when its RPC ends
    # before the failure is recorded (seen once in CI): up to three fresh attempts.
    retried = []  # (operation, its final state) of the attempts Spark closed otherwise
    for attempt in range(3):
        failed = str(uuid.uuid4())
        try:
            drain(s.ExecutePlan(pb.ExecutePlanRequest(
                session_id=source, user_context=who, operation_id=failed,
                plan=pb.Plan(root=rel.Relation()))))
        except grpc.RpcError:
            pass
        state = settled(s, source, who, failed, {"OPERATION_STATE_FAILED"})
        if state == "OPERATION_STATE_FAILED":
            break
        retried.append((failed, state))
    expect(report(outcome("status_failed", lambda: settled(
        s, source, who, failed, {"OPERATION_STATE_FAILED"}))),
           code="OK", result="OPERATION_STATE_FAILED")
    kept = str(uuid.uuid4())
    read_to_end(s, source, who, kept, pb.Plan(root=rel.Relation()))
    expect(report(outcome("status_failed_unreleased", lambda: settled(
        s, source, who, kept, {"OPERATION_STATE_TERMINATING"}))),
           code="OK", result="OPERATION_STATE_TERMINATING")
    expected = sorted([(kept, "OPERATION_STATE_TERMINATING"),
                       (running, "OPERATION_STATE_CANCELLED"),
                       (finished, "OPERATION_STATE_SUCCEEDED"),
                       (failed, "OPERATION_STATE_FAILED")] + retried)
    expect(report(outcome("status_of_every_operation", lambda: sorted(
        statuses(s, source, who, [])) == expected)), code="OK", result=True)
    # The clone has none of the source's operations.
    expect(report(outcome("status_of_the_clone", lambda: statuses(s, target, who, []))),
           code="OK", result=[])
    s.ReleaseExecute(pb.ReleaseExecuteRequest(
        session_id=source, user_context=who, operation_id=kept,
        release_all=pb.ReleaseExecuteRequest.ReleaseAll()))

    # PySpark's cloneSession(): the clone starts with the source's configuration, then the
    # two are independent.
    a = pyspark_session(port, "tether-pyspark-clone", str(uuid.uuid4()))
    a.conf.set("tether.clone.shared", "from-a")
    b = a.cloneSession()
    ok = b.conf.get("tether.clone.shared") == "from-a"
    b.conf.set("tether.clone.shared", "from-b")
    a.conf.set("tether.clone.only-a", "a")
    ok = ok and a.conf.get("tether.clone.shared") == "from-a"
    ok = ok and b.conf.get("tether.clone.shared") == "from-b"
    ok = ok and b.conf.get("tether.clone.only-a", None) is None
    ok = ok and [r.id for r in b.range(3).collect()] == [0, 1, 2]
    given = str(uuid.uuid4())
    c = a.cloneSession(given)
    ok = ok and c.client._session_id == given and c.conf.get("tether.clone.shared") == "from-a"
    expect(report({"case": "pyspark_clone_session", "code": "OK", "result": ok}),
           code="OK", result=True)
    # A cloned PySpark session has no stop() of its own (pyspark-client 4.2.0): its server
    # session is released raw.
    for clone_of_a in (b, c):
        s.ReleaseSession(pb.ReleaseSessionRequest(
            session_id=clone_of_a.client._session_id, user_context=user("tether-pyspark-clone")))
    a.stop()
    s.ReleaseSession(pb.ReleaseSessionRequest(session_id=target, user_context=who))
    s.ReleaseSession(pb.ReleaseSessionRequest(session_id=source, user_context=who))
    print("SESSIONS DONE", flush=True)


def config_set(s, session, who, key, value):
    s.Config(pb.ConfigRequest(session_id=session, user_context=who,
                              operation=pb.ConfigRequest.Operation(set=pb.ConfigRequest.Set(
                                  pairs=[pb.KeyValue(key=key, value=value)]))))


def config_get(s, session, who, key):
    return s.Config(pb.ConfigRequest(
        session_id=session, user_context=who, operation=pb.ConfigRequest.Operation(
            get=pb.ConfigRequest.Get(keys=[key])))).pairs[0].value


def drain_error(stream):
    """Reads a stream to its end; returns the gRPC code that ended it ("OK" without one)."""
    try:
        for _ in stream:
            pass
        return "OK"
    except grpc.RpcError as e:
        return e.code().name


def sql(port):
    s = stub(port)
    session, a = str(uuid.uuid4()), user("tether-sql")
    for name, query, args in [("sql_query", "SELECT id FROM range(3)", []),
                              ("sql_positional", "SELECT ? AS x", [7])]:
        plan = pb.Plan()
        sql_input = plan.command.sql_command.input
        sql_input.common.plan_id = 7
        sql_input.sql.query = query
        for value in args:
            sql_input.sql.pos_arguments.add().literal.integer = value

        def call():
            results = []
            for r in s.ExecutePlan(pb.ExecutePlanRequest(
                    session_id=session, user_context=a, plan=plan,
                    request_options=reattachable())):
                if r.HasField("sql_command_result"):
                    results.append(r.sql_command_result.relation.SerializeToString(
                        deterministic=True) == sql_input.SerializeToString(deterministic=True))
            return {"sql_command_results": len(results), "relation_as_sent": all(results)}
        expect(report(outcome(name, call)), code="OK",
               result={"sql_command_results": 1, "relation_as_sent": True})
    spark = pyspark_session(port, "tether-sql", str(uuid.uuid4()))
    df = spark.sql("SELECT ? AS x", args=[7])
    relation = df._plan._plan  # a CachedRelation of the sql_command_result's relation
    case = {"case": "pyspark_sql", "code": "OK", "plan": type(df._plan).__name__,
            "query": relation.sql.query, "arguments": len(relation.sql.pos_arguments)}
    expect(report(case), plan="CachedRelation", query="SELECT ? AS x", arguments=1)
    spark.stop()
    print("SQL DONE", flush=True)


def main():
    mode, port = sys.argv[1], int(sys.argv[2])
    if mode == "errors":
        errors(port)
    elif mode == "config":
        config(port)
    elif mode == "differences":
        differences(port)
    elif mode == "isolation":
        isolation(port)
    elif mode == "sessions":
        sessions(port)
    elif mode == "abandon-start":
        abandon_start(port, sys.argv[3], sys.argv[4])
    elif mode == "abandon-check":
        abandon_check(port, sys.argv[3], sys.argv[4])
    elif mode == "drain-read":
        total = int(sys.argv[3]) if len(sys.argv) > 3 else 5_000_000
        drain_read(port, total, sys.argv[4] if len(sys.argv) > 4 else None)
    elif mode == "sql":
        sql(port)
    elif mode == "chunked":
        chunked(port, int(sys.argv[3]), sys.argv[4] == "1",
                int(sys.argv[5]) if len(sys.argv) > 5 else None)
    elif mode == "admission":
        admission(port, int(sys.argv[3]), int(sys.argv[4]))
    elif mode == "artifacts":
        artifacts(port)
    elif mode == "artifact-differences":
        artifact_differences(port)
    elif mode == "artifact-limits":
        artifact_limits(port, int(sys.argv[3]))
    elif mode == "artifacts-pyspark":
        artifacts_pyspark(port)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
