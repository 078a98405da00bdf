"""A small Python peer of the official UdfWorker gRPC service, for tether's conformance tests.

Both sides use grpcio and the classes generated from Spark 4.3.0's official .proto files
(udf_protos.py); nothing here shares code with tether. Driven by tests/conformance/.

  grpc_peer.py worker --socket PATH
      Serves UdfWorker on unix:PATH (messages up to 128 MiB each way) with an echo UDF:
        - Init -> InitResponse(data=b"python-worker"); an inline or chunked payload equal to
          b"INIT_ERROR" -> InitResponse(error=WorkerError); chunks are assembled and checked
          against payload_size / payload_crc32;
        - DataRequest -> DataResponse with the same bytes; the batch b"ERROR" ->
          ErrorResponse(UserError, error_class "SimulatedError"), later batches ignored;
        - Finish -> FinishResponse(metrics status/batches/bytes), unless an error was
          reported (then the engine must Cancel);
        - Cancel -> CancelResponse(metrics status/batches);
        - Manage: Heartbeat -> metrics {worker: python, sessions: N}; Shutdown ->
          sessions_settled=True, then the server stops and the process exits 0.
      Prints JSON lines on stdout: {"event": "ready"} once serving, one {"event": "session"}
      per Execute stream (the request and response kinds in order, the Init it received
      without its payload, payload length and CRC-32, batch sizes, cancel reason, how the
      stream ended), {"event": "shutdown"}. Exits when stdin closes (the test is gone).

  grpc_peer.py engine --socket PATH [--scenarios a,b,...] [--default-authority]
      Drives the worker at unix:PATH like Spark's engine (`:authority` localhost, messages up
      to 128 MiB), one Execute stream per scenario on one channel, and asserts the exact
      response sequence of each (see SCENARIOS). Prints one JSON report on stdout and exits
      0 iff every scenario passed.
"""

import argparse
import json
import queue
import sys
import threading
import time
import zlib
from concurrent import futures

sys.dont_write_bytecode = True  # keep tests/python free of __pycache__

import udf_protos  # noqa: E402

udf_protos.check_requirements()  # before importing the packages it checks

import grpc  # noqa: E402
from google.protobuf import json_format  # noqa: E402

PB = udf_protos.load()
M = PB.messages
MIB = 1024 * 1024
MAX_MESSAGE = 128 * MIB
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.max_receive_message_length", MAX_MESSAGE),
]
# The engine's :authority. Spark's engine sends `localhost` over a Unix socket (spec 6.4);
# grpcio's default for a `unix:/path` target is the percent-encoded socket path, which is not
# a valid HTTP authority (strict HTTP/2 servers, h2 included, reset such streams with
# PROTOCOL_ERROR). `engine --default-authority` keeps grpcio's default, to reproduce that.
ENGINE_AUTHORITY = ("grpc.default_authority", "localhost")
LARGE_SIZES = (39 * MIB // 10, 6 * MIB, 20 * MIB)


def request_kind(request):
    """`init`, `payload`, `finish`, `cancel`, `data` or `empty` for a UdfRequest."""
    which = request.WhichOneof("request")
    if which == "control":
        return request.control.WhichOneof("control") or "empty-control"
    return which or "empty"


def response_kind(response):
    """`init`, `finish`, `cancel`, `error`, `data` or `empty` for a UdfResponse."""
    which = response.WhichOneof("response")
    if which == "control":
        return response.control.WhichOneof("control") or "empty-control"
    return which or "empty"


def pattern(size, seed):
    """`size` deterministic bytes, differing per seed (a 251-byte period catches shifts)."""
    block = bytes((i * 31 + seed * 7) % 256 for i in range(251))
    return (block * (size // len(block) + 1))[:size]


def emit(event):
    """One JSON line on stdout (thread-safe)."""
    with emit.lock:
        sys.stdout.write(json.dumps(event, sort_keys=True) + "\n")
        sys.stdout.flush()


emit.lock = threading.Lock()


# ---------------------------------------------------------------------------------------------
# Worker
# ---------------------------------------------------------------------------------------------


def control_response(**kwargs):
    return M.UdfResponse(control=M.UdfControlResponse(**kwargs))


class EchoWorker(PB.service_grpc.UdfWorkerServicer):
    """The UdfWorker service with the echo UDF described in the module docs."""

    def __init__(self, stop):
        self.stop = stop
        self.sessions = 0
        self.lock = threading.Lock()

    def Execute(self, request_iterator, context):
        """One session: answers each request as it arrives, logs the exchange at the end."""
        with self.lock:
            self.sessions += 1
        log = {
            "event": "session",
            "requests": [],
            "responses": [],
            "data_sizes": [],
            "init": None,
            "payload_len": None,
            "payload_crc32": None,
            "cancel_reason": None,
            "end": None,
        }

        def respond(response):
            log["responses"].append(response_kind(response))
            return response

        init = None
        chunks = []
        errored = False
        batches = 0
        total = 0
        try:
            for request in request_iterator:
                kind = request_kind(request)
                log["requests"].append(kind)
                if kind == "init":
                    init = request.control.init
                    shown = M.Init()
                    shown.CopyFrom(init)
                    shown.udf.ClearField("payload")
                    log["init"] = json_format.MessageToDict(
                        shown, preserving_proto_field_name=True
                    )
                    if not init.is_chunking_payload:
                        response, errored = self.answer_init(init, init.udf.payload, log)
                        yield respond(response)
                elif kind == "payload":
                    chunks.append(request.control.payload.data)
                    if request.control.payload.last:
                        payload = init.udf.payload + b"".join(chunks)
                        response, errored = self.answer_init(init, payload, log)
                        yield respond(response)
                elif kind == "data":
                    data = request.data.data
                    log["data_sizes"].append(len(data))
                    if errored:
                        continue
                    batches += 1
                    total += len(data)
                    if data == b"ERROR":
                        errored = True
                        error = M.ExecutionError(
                            user=M.UserError(
                                message="simulated user error",
                                traceback="Traceback (most recent call last):\n  udf()",
                                error_class="SimulatedError",
                            )
                        )
                        yield respond(control_response(error=M.ErrorResponse(error=error)))
                    else:
                        yield respond(M.UdfResponse(data=M.DataResponse(data=data)))
                elif kind == "finish":
                    if errored:
                        continue  # an error was reported: the engine must Cancel
                    metrics = {"status": "ok", "batches": str(batches), "bytes": str(total)}
                    finish = M.FinishResponse(metrics=metrics, data=b"python-finish")
                    log["end"] = "finish"  # before the yield: the stream may close there
                    yield respond(control_response(finish=finish))
                    return
                elif kind == "cancel":
                    cancel = request.control.cancel
                    if cancel.HasField("reason"):
                        log["cancel_reason"] = cancel.reason
                    metrics = {"status": "cancelled", "batches": str(batches)}
                    log["end"] = "cancel"
                    yield respond(control_response(cancel=M.CancelResponse(metrics=metrics)))
                    return
            log["end"] = "request stream ended"
        finally:
            emit(log)

    @staticmethod
    def answer_init(init, payload, log):
        """The InitResponse for `payload` (assembled) and whether it reports an error."""
        log["payload_len"] = len(payload)
        log["payload_crc32"] = zlib.crc32(payload)
        udf = init.udf
        problem = None
        if udf.HasField("payload_size") and udf.payload_size != len(payload):
            problem = f"payload_size {udf.payload_size} != {len(payload)} bytes received"
        elif udf.HasField("payload_crc32") and udf.payload_crc32 != zlib.crc32(payload):
            problem = "payload_crc32 mismatch"
        if problem:
            error = M.ExecutionError(protocol=M.ProtocolError(message=problem))
            return control_response(init=M.InitResponse(error=error)), True
        if payload == b"INIT_ERROR":
            error = M.ExecutionError(worker=M.WorkerError(message="python init failure"))
            return control_response(init=M.InitResponse(error=error)), True
        return control_response(init=M.InitResponse(data=b"python-worker")), False

    def Manage(self, request, context):
        which = request.WhichOneof("manage")
        if which == "heartbeat":
            with self.lock:
                metrics = {"worker": "python", "sessions": str(self.sessions)}
            return M.WorkerResponse(heartbeat=M.HeartbeatResponse(metrics=metrics))
        if which == "shutdown":
            shutdown = request.shutdown
            emit(
                {
                    "event": "shutdown",
                    "reason": shutdown.reason if shutdown.HasField("reason") else None,
                    "cancel_sessions": shutdown.cancel_sessions,
                }
            )
            # Answer first, then stop.
            threading.Timer(0.2, self.stop.set).start()
            return M.WorkerResponse(shutdown=M.ShutdownResponse(sessions_settled=True))
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "empty WorkerRequest")


def run_worker(socket_path):
    stop = threading.Event()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), options=CHANNEL_OPTIONS)
    PB.service_grpc.add_UdfWorkerServicer_to_server(EchoWorker(stop), server)
    if not server.add_insecure_port(f"unix:{socket_path}"):
        sys.exit(f"cannot listen on unix:{socket_path}")
    server.start()

    def watch_stdin():
        sys.stdin.read()  # returns at EOF: the test process is gone
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    emit({"event": "ready", "socket": socket_path})
    stop.wait()
    server.stop(grace=2).wait()
    return 0


# ---------------------------------------------------------------------------------------------
# Engine
# ---------------------------------------------------------------------------------------------


class Failed(Exception):
    """A scenario's expectation did not hold."""


def expect(condition, message):
    if not condition:
        raise Failed(message)


class Stream:
    """One Execute stream driven message by message, recording both directions."""

    def __init__(self, stub):
        self.outbox = queue.Queue()
        self.sent = []
        self.received = []
        # The request iterator yields until the None sentinel: the half-close.
        self.call = stub.Execute(iter(self.outbox.get, None), timeout=60)

    def send(self, request):
        self.sent.append(request_kind(request))
        self.outbox.put(request)

    def recv(self):
        try:
            response = next(self.call)
        except StopIteration:
            self.received.append("end")
            return None
        self.received.append(response_kind(response))
        return response

    def recv_control(self, kind):
        response = self.recv()
        expect(response is not None, f"stream ended while expecting {kind}")
        got = response_kind(response)
        expect(got == kind, f"expected {kind}, got {got}")
        return getattr(response.control, kind)

    def recv_data(self):
        response = self.recv()
        expect(response is not None, "stream ended while expecting data")
        expect(response_kind(response) == "data", f"expected data, got {response_kind(response)}")
        return response.data.data

    def close(self):
        """Half-closes the request side; the response stream must end cleanly with nothing more."""
        self.outbox.put(None)
        rest = [response_kind(r) for r in self.call]
        self.received.extend(rest)
        self.received.append("end")
        expect(not rest, f"unexpected responses after the terminator: {rest}")
        code = self.call.code()
        expect(code == grpc.StatusCode.OK, f"stream ended with {code}: {self.call.details()}")


def init_request(payload, name):
    udf = M.UdfPayload(
        payload=payload,
        format="echo",
        payload_size=len(payload),
        payload_crc32=zlib.crc32(payload),
        name=name,
        eval_type="SQL_SCALAR_PANDAS_UDF",
    )
    init = M.Init(
        protocol_version=1,
        data_format=PB.common.ARROW,
        udf=udf,
        task_context={"partition_id": "3", "task_attempt_id": "41"},
        session_conf={"spark.sql.execution.arrow.maxRecordsPerBatch": "10000"},
        timezone="Europe/Amsterdam",
    )
    return M.UdfRequest(control=M.UdfControlRequest(init=init))


def data_request(data):
    return M.UdfRequest(data=M.DataRequest(data=data))


def finish_request():
    return M.UdfRequest(control=M.UdfControlRequest(finish=M.Finish()))


def cancel_request(reason):
    return M.UdfRequest(control=M.UdfControlRequest(cancel=M.Cancel(reason=reason)))


class Scenario:
    """What one scenario needs and leaves behind: the stub, its stream, details to report."""

    def __init__(self, stub):
        self.stub = stub
        self.stream = None
        self.details = {}

    def open(self):
        self.stream = Stream(self.stub)
        return self.stream


def accept_init(stream, payload, name):
    stream.send(init_request(payload, name))
    response = stream.recv_control("init")
    expect(not response.HasField("error"), f"init failed: {response.error}")
    return response


def scenario_finish(ctx):
    s = ctx.open()
    accept_init(s, b"finish", "finish")
    for batch in (b"alpha", b"beta"):
        s.send(data_request(batch))
        echoed = s.recv_data()
        expect(echoed == batch, f"echo of {batch!r} came back as {echoed!r}")
    s.send(finish_request())
    finish = s.recv_control("finish")
    ctx.details["metrics"] = dict(finish.metrics)
    expect(dict(finish.metrics) == {"status": "ok", "batches": "2"}, f"metrics {finish.metrics}")
    expect(not finish.HasField("error"), f"finish error: {finish.error}")
    s.close()


def scenario_cancel(ctx):
    s = ctx.open()
    accept_init(s, b"cancel", "cancel")
    s.send(data_request(b"a"))
    expect(s.recv_data() == b"a", "echo of b'a'")
    s.send(cancel_request("python cancel"))
    cancel = s.recv_control("cancel")
    ctx.details["metrics"] = dict(cancel.metrics)
    expect(dict(cancel.metrics) == {"status": "cancelled"}, f"metrics {cancel.metrics}")
    expect(not cancel.HasField("error"), f"cancel error: {cancel.error}")
    s.close()


def scenario_error(ctx):
    s = ctx.open()
    accept_init(s, b"error", "error")
    s.send(data_request(b"ERROR"))
    error = s.recv_control("error").error
    ctx.details["error"] = json_format.MessageToDict(error, preserving_proto_field_name=True)
    expect(error.WhichOneof("kind") == "user", f"expected a user error, got {error}")
    expect(error.user.message == "simulated user error", f"message {error.user.message!r}")
    expect(error.user.error_class == "SimulatedError", f"class {error.user.error_class!r}")
    s.send(cancel_request("python cancel after error"))
    s.recv_control("cancel")
    s.close()


def scenario_init_error(ctx):
    s = ctx.open()
    s.send(init_request(b"INIT_ERROR", "init_error"))
    init = s.recv_control("init")
    expect(init.HasField("error"), "InitResponse without error")
    ctx.details["error"] = json_format.MessageToDict(init.error, preserving_proto_field_name=True)
    expect(init.error.WhichOneof("kind") == "worker", f"expected a worker error: {init.error}")
    expect(init.error.worker.message == "simulated init failure", f"{init.error.worker.message!r}")
    s.send(cancel_request("python cancel after init error"))
    s.recv_control("cancel")
    s.close()


def scenario_half_close_is_not_finish(ctx):
    """An ended request stream must never be taken for Finish (issue 3, spec section 2)."""
    s = ctx.open()
    accept_init(s, b"half_close", "half_close")
    s.send(data_request(b"x"))
    expect(s.recv_data() == b"x", "echo of b'x'")
    s.outbox.put(None)  # half-close without Finish
    error = s.recv_control("error").error
    ctx.details["error"] = json_format.MessageToDict(error, preserving_proto_field_name=True)
    expect(error.WhichOneof("kind") == "protocol", f"expected a protocol error: {error}")
    s.recv_control("cancel")
    end = s.recv()
    expect(end is None, "response after CancelResponse")
    code = s.call.code()
    expect(code == grpc.StatusCode.OK, f"stream ended with {code}: {s.call.details()}")


def scenario_large(ctx):
    s = ctx.open()
    payload = pattern(6 * MIB, 1)
    accept_init(s, payload, "large")
    ctx.details["sizes"] = []
    for seed, size in enumerate(LARGE_SIZES):
        batch = pattern(size, seed + 2)
        s.send(data_request(batch))
        echoed = s.recv_data()
        expect(len(echoed) == size, f"{size}-byte batch came back with {len(echoed)} bytes")
        expect(echoed == batch, f"{size}-byte batch came back altered")
        ctx.details["sizes"].append(size)
    s.send(finish_request())
    finish = s.recv_control("finish")
    expect(finish.metrics.get("batches") == str(len(LARGE_SIZES)), f"metrics {finish.metrics}")
    s.close()


def scenario_manage(ctx):
    response = ctx.stub.Manage(M.WorkerRequest(heartbeat=M.Heartbeat()), timeout=10)
    expect(response.WhichOneof("manage") == "heartbeat", f"heartbeat answered {response}")
    ctx.details["heartbeat_metrics"] = dict(response.heartbeat.metrics)
    expect("active_sessions" in response.heartbeat.metrics, "no active_sessions metric")
    try:
        ctx.stub.Manage(M.WorkerRequest(), timeout=10)
        raise Failed("an empty WorkerRequest was answered")
    except grpc.RpcError as e:
        ctx.details["empty_request_status"] = e.code().name
        expect(e.code() == grpc.StatusCode.INVALID_ARGUMENT, f"empty request gave {e.code()}")


def scenario_shutdown(ctx):
    request = M.WorkerRequest(shutdown=M.ShutdownRequest(reason="python engine done"))
    response = ctx.stub.Manage(request, timeout=10)
    expect(response.WhichOneof("manage") == "shutdown", f"shutdown answered {response}")
    ctx.details["sessions_settled"] = response.shutdown.sessions_settled


SCENARIOS = {
    "finish": scenario_finish,
    "cancel": scenario_cancel,
    "error": scenario_error,
    "init_error": scenario_init_error,
    "half_close_is_not_finish": scenario_half_close_is_not_finish,
    "large": scenario_large,
    "manage": scenario_manage,
    "shutdown": scenario_shutdown,
}


def run_engine(socket_path, names, default_authority=False):
    options = CHANNEL_OPTIONS if default_authority else [*CHANNEL_OPTIONS, ENGINE_AUTHORITY]
    channel = grpc.insecure_channel(f"unix:{socket_path}", options=options)
    grpc.channel_ready_future(channel).result(timeout=15)
    stub = PB.service_grpc.UdfWorkerStub(channel)
    report = {"ok": True, "scenarios": [], "versions": {"grpcio": grpc.__version__}}
    for name in names:
        ctx = Scenario(stub)
        entry = {"name": name, "ok": True, "error": None, "details": ctx.details}
        started = time.monotonic()
        try:
            SCENARIOS[name](ctx)
        except (Failed, grpc.RpcError) as e:
            entry["ok"] = False
            entry["error"] = f"{type(e).__name__}: {e}"
            report["ok"] = False
            if ctx.stream is not None:
                ctx.stream.call.cancel()
        entry["seconds"] = round(time.monotonic() - started, 3)
        entry["requests"] = ctx.stream.sent if ctx.stream else None
        entry["responses"] = ctx.stream.received if ctx.stream else None
        report["scenarios"].append(entry)
    channel.close()
    emit(report)
    return 0 if report["ok"] else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("worker", "engine"))
    parser.add_argument("--socket", required=True)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument(
        "--default-authority",
        action="store_true",
        help="engine: keep grpcio's :authority (the socket path) instead of localhost",
    )
    args = parser.parse_args()
    if args.mode == "worker":
        return run_worker(args.socket)
    names = [n for n in args.scenarios.split(",") if n]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenarios: {unknown}")
    return run_engine(args.socket, names, args.default_authority)


if __name__ == "__main__":
    sys.exit(main())
