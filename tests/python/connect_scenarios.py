"""Spark Connect error, abandonment and isolation scenarios, run against any Spark Connect
server: tether's example server (tests/rx/pyspark_connect.rs) and, in CI, the real Spark 4.3.0
server, so that both servers' answers can be compared.

Run with the interpreter of target/pyspark-venv (scripts/pyspark-env.sh):

    python tests/python/connect_scenarios.py errors PORT
        Raw requests through pyspark-client's generated stubs: a reattach to an unknown
        operation (OPERATION_NOT_FOUND), a duplicate active operation id with another plan
        (OPERATION_ALREADY_EXISTS) and with the same plan (a reattach from the start),
        operation ids that are no UUID, an empty relation, an Interrupt in a brand-new
        session, a reattach in an unknown session. Prints one
        `CASE {json}` line per case: gRPC code, condition, SQLSTATE, messageParameters
        names, and the exception class PySpark raises for it. Exits 0 after `ERRORS DONE`.

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

Exit status: 0 when every check passed, 1 (with a traceback) when one failed, 3 with a
message starting with "ENV:" when pyspark-client cannot be imported.
"""

import json
import sys
import time
import uuid

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
    s.ReleaseSession(pb.ReleaseSessionRequest(session_id=session, user_context=a))
    print("ERRORS DONE", flush=True)


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
    failed = str(uuid.uuid4())
    try:
        drain(s.ExecutePlan(pb.ExecutePlanRequest(
            session_id=source, user_context=who, operation_id=failed,
            plan=pb.Plan(root=rel.Relation()))))
    except grpc.RpcError:
        pass
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
                       (failed, "OPERATION_STATE_FAILED")])
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


def main():
    mode, port = sys.argv[1], int(sys.argv[2])
    if mode == "errors":
        errors(port)
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
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
