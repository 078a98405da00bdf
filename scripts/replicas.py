"""The CI-only replicas step (scripts/replicas.sh): two tether example servers behind a real
HAProxy, read by real PySpark clients, on loopback. The deployment it builds is the one
docs/deployment.md describes.

Set-up: two `examples/connect_server` replicas, r1 and r2, on free ports, with stream
rotation on (every stream ends after one response, 123 bytes, or 1 s: each execution is
read across many ReattachExecute calls), `--metrics-addr` and `--events-log`; HAProxy in
front (HTTP mode, HTTP/2 on both sides, `balance roundrobin` for a session's first request
and a stick table on the `x-spark-connect-session-id` header for every later one, layer-4
health checks every 500 ms, `option redispatch`, the runtime API on a Unix socket). Each
client sets `;session_id=S;x-spark-connect-session-id=S` (tests/python/replica_client.py).
Everything is written under target/replicas/ (the HAProxy configuration, every log).

1. 8 clients in parallel, each with its own session, read spark.range(1000000) once
   (`toArrow()`): every id once and in order; each session was served by one replica only
   (the replicas' events logs), both replicas served sessions (their `stats` lines:
   created > 0), and no request met OPERATION_NOT_FOUND or SESSION_NOT_FOUND (the replicas'
   `tether_connect_errors_total`). Before them, a client without the header is refused by
   HAProxy at once (FAILED_PRECONDITION, saying what is missing).
2. 8 clients read spark.range(1000000) slowly; once each has its first rows, r1 is killed
   (SIGKILL). r1's clients must end within 30 s with an error (printed: PySpark's
   RESPONSE_ALREADY_RECEIVED after HAProxy redispatched their next ReattachExecute to r2,
   which does not know the session); r2's clients read every id once. r1 restarts on the
   same port; 4 new sessions read range(1000000), and the restarted r1 serves some.
3. Drain (skipped, saying so, while `connect_server --help` has no drain): 4 clients read
   slowly; r1 is put in DRAIN state through HAProxy's runtime API and sent SIGTERM; r1's
   running reads finish, every id once; 4 new sessions during the drain are served by r2
   only; r1 exits 0; r1 restarts and is set `ready` again (a rolling restart's steps). A
   session of r1 that starts a new query after the SIGTERM starts no execution on r1; how
   it ends, and when, is printed.

Usage: python3 scripts/replicas.py SERVER_BINARY PYSPARK_PYTHON [--haproxy PATH]
(scripts/replicas.sh installs HAProxy, builds the server and the venv first). Prints each
part's time and figures; exit status 0 when every check held, 1 otherwise.
"""

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO, "target", "replicas")
CLIENT = os.path.join(REPO, "tests", "python", "replica_client.py")
HEADER = "x-spark-connect-session-id"
BACKEND = "replicas"
ROWS = 1_000_000
CLIENTS = 8
# Every stream ends after one response (123 bytes) or 1 s, as Spark's own reattach tests
# configure it: a read of range(1000000) is 100 batches, 100 ReattachExecute calls.
ROTATION = ["--max-stream-bytes", "123", "--max-stream-duration-ms", "1000"]
# A paced read (parts 2 and 3): 0.1 s per batch of 10 000 rows, about 10 s for 1000000 rows.
PACE = "0.1"
FAIL_WITHIN = 30.0
DRAIN_TIMEOUT_MS = 60_000
NOT_FOUND = ("INVALID_HANDLE.OPERATION_NOT_FOUND", "INVALID_HANDLE.SESSION_NOT_FOUND")

FAILURES = []
PROCESSES = []


def fail(what):
    print(f"   FAILED: {what}", flush=True)
    FAILURES.append(what)


def check(ok, what):
    if ok:
        print(f"   ok: {what}", flush=True)
    else:
        fail(what)
    return ok


def free_port():
    """A free loopback port below the kernel's ephemeral range: no outgoing connection takes
    it while a replica is down and about to restart on it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(200):
        port = random.randrange(max(1024, low - 20000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise AssertionError("no free port below the ephemeral range")


def spawn(cmd, **kw):
    """Starts a process that main()'s cleanup (and scripts/replicas.sh's trap) ends."""
    proc = subprocess.Popen(cmd, cwd=REPO, **kw)
    PROCESSES.append(proc)
    with open(os.path.join(OUT, "pids"), "a") as f:
        f.write(f"{proc.pid}\n")
    return proc


def wait_until(what, timeout, probe, interval=0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(interval)


class Part:
    def __init__(self, name):
        self.name = name

    def __enter__(self):
        print(f"== {self.name}", flush=True)
        self.start = time.monotonic()
        return self

    def __exit__(self, kind, value, tb):
        print(f"== {self.name}: {time.monotonic() - self.start:.1f} s", flush=True)
        if kind is AssertionError:
            fail(f"{self.name}: {value}")
            return True
        return False


# ---------------------------------------------------------------------------------------------
# The replicas
# ---------------------------------------------------------------------------------------------

class Replica:
    """One `connect_server` process; `start` again after it ended restarts it on its port."""

    def __init__(self, name, binary, extra):
        self.name, self.binary, self.extra = name, binary, extra
        self.port = free_port()
        self.metrics_port = free_port()
        self.incarnation = 0
        self.proc = None
        self.stats = None

    def start(self):
        self.incarnation += 1
        base = os.path.join(OUT, f"{self.name}-{self.incarnation}")
        self.events = base + ".events.jsonl"
        self.log = base + ".log"
        self.stats = self.drained = None
        cmd = [self.binary, "--host", "127.0.0.1", "--port", str(self.port), *ROTATION,
               "--stats-interval-ms", "200", "--metrics-addr", f"127.0.0.1:{self.metrics_port}",
               "--events-log", self.events, *self.extra]
        self.proc = spawn(cmd, stdout=subprocess.PIPE, stderr=open(self.log, "w"), text=True,
                          env={**os.environ, "RUST_LOG": "info"})
        listening = threading.Event()
        address = []

        def read(proc=self.proc):
            for line in proc.stdout:
                line = line.strip()
                if line.startswith("listening on "):
                    address.append(line.rsplit(":", 1)[1])
                    listening.set()
                elif line.startswith("stats "):
                    self.stats = dict(kv.split("=", 1) for kv in line.split()[1:])
                elif line.startswith("drained "):
                    # The drain's report: `drained live_at_start=N canceled=N …`.
                    self.drained = dict(kv.split("=", 1) for kv in line.split()[1:]
                                        if "=" in kv)
            listening.set()

        threading.Thread(target=read, daemon=True).start()
        if not listening.wait(30) or not address:
            raise AssertionError(f"{self.name} did not start (see {self.log})")
        self.port = int(address[0])
        return self

    def stat(self, key):
        return int((self.stats or {}).get(key, -1))

    def stats_text(self):
        return " ".join(f"{k}={v}" for k, v in (self.stats or {}).items())

    def metrics(self):
        """`name{labels}` -> value, from the replica's /metrics."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def errors(self, condition):
        key = f'tether_connect_errors_total{{condition="{condition}"}}'
        return int(self.metrics().get(key, 0))

    def started(self):
        """The session id of each execution this incarnation started (its events log)."""
        out = []
        try:
            with open(self.events) as f:
                for line in f:
                    try:
                        e = json.loads(line)
                    except ValueError:
                        continue  # a line being written
                    if e.get("kind") == "OperationStarted":
                        out.append(e["session_id"])
        except FileNotFoundError:
            pass
        return out

    def sessions(self):
        """The session ids this incarnation ran an execution for."""
        return set(self.started())


# ---------------------------------------------------------------------------------------------
# HAProxy
# ---------------------------------------------------------------------------------------------

CONFIG = """\
# Written by scripts/replicas.py; explained in docs/deployment.md.
global
    log stdout format raw local0 info
    # The runtime API: `set server {backend}/r1 state drain|ready`, `show table {backend}`.
    stats socket {socket} mode 600 level admin

defaults
    mode http
    log global
    option httplog
    timeout connect 1s
    # Longer than any silence on a response stream (tether and Spark end each stream
    # after 2 min at most, senderMaxStreamDuration).
    timeout client 10m
    timeout server 10m
    # A connection the replica of a session refuses is retried (1 s apart); once that
    # replica is DOWN, or at the last retry, on another replica (redispatch), which answers
    # SESSION_NOT_FOUND / OPERATION_NOT_FOUND at once.
    retries 3
    option redispatch

frontend spark_connect
    bind 127.0.0.1:{port} proto h2
    # The routing key in the access log, one line per RPC.
    capture request header {header} len 64
    # A Spark Connect call without the routing key would go round-robin, call by call, and
    # break its session: refuse it at once with a gRPC status that says what is missing
    # (FAILED_PRECONDITION, which PySpark does not retry).
    http-request return status 200 hdr grpc-status 9 hdr grpc-message "no {header} header: add ;{header}=<the session id> to the connection string" if {{ path_beg /spark.connect. }} !{{ req.hdr({header}) -m found }}
    default_backend {backend}

backend {backend}
    # A session's first request goes round-robin; the table remembers where, and every
    # later request with the same header goes there (also to a server in DRAIN state).
    # An entry outlives the replicas' idle-session timeout (1 h) by an hour.
    balance roundrobin
    stick-table type string len 64 size 100k expire 2h
    stick on req.hdr({header})
    # Layer-4 checks: a killed replica is DOWN within a second. Not the gRPC health: HAProxy
    # ignores the table for a DOWN server, so a draining replica whose health says
    # NOT_SERVING would lose the sessions it is still serving.
    default-server check inter 500ms fall 2 rise 2
{servers}
"""


class HAProxy:
    def __init__(self, binary, replicas):
        self.binary = binary
        self.port = free_port()
        self.socket = os.path.join(OUT, "haproxy.sock")
        self.config = os.path.join(OUT, "haproxy.cfg")
        self.log = os.path.join(OUT, "haproxy.log")
        servers = "\n".join(f"    server {r.name} 127.0.0.1:{r.port} proto h2"
                            for r in replicas)
        with open(self.config, "w") as f:
            f.write(CONFIG.format(socket=self.socket, port=self.port, header=HEADER,
                                  backend=BACKEND, servers=servers))

    def start(self):
        valid = subprocess.run([self.binary, "-c", "-f", self.config],
                               capture_output=True, text=True)
        if valid.returncode != 0:
            raise AssertionError(f"haproxy -c: {valid.stdout}{valid.stderr}")
        self.proc = spawn([self.binary, "-db", "-f", self.config],
                          stdout=open(self.log, "w"), stderr=subprocess.STDOUT)
        wait_until("HAProxy's runtime API", 10, lambda: os.path.exists(self.socket))
        return self

    def command(self, line):
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(self.socket)
            s.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def status(self):
        """Server name -> its status in `show stat` (UP, DOWN, DRAIN, …)."""
        lines = self.command("show stat").splitlines()
        header = lines[0].lstrip("# ").split(",")
        out = {}
        for line in lines[1:]:
            row = dict(zip(header, line.split(",")))
            if row.get("pxname") == BACKEND and row.get("svname") not in ("BACKEND", None):
                out[row["svname"]] = row["status"]
        return out

    def wait_status(self, server, want, timeout=15):
        return wait_until(f"HAProxy: {server} {want}", timeout,
                          lambda: self.status().get(server) == want)

    def table(self):
        """Session id -> the server the stick table holds for it."""
        out = {}
        for line in self.command(f"show table {BACKEND}").splitlines():
            m = re.search(r"key=(\S+) .*server_key=(\S+)", line)
            if m:
                out[m.group(1)] = m.group(2)
        return out


# ---------------------------------------------------------------------------------------------
# PySpark clients
# ---------------------------------------------------------------------------------------------

class Client:
    """tests/python/replica_client.py in its own process: its STARTED, WAITING and result
    lines (`result`: the last DONE or ERROR)."""

    def __init__(self, python, port, label, rows=ROWS, pace=None, header=True, queries=1):
        self.label, self.session, self.rows = label, str(uuid.uuid4()), rows
        self.started, self.waiting = threading.Event(), threading.Event()
        self.result = self.stop_error = None
        self.ended_at = None
        cmd = [python, CLIENT, str(port), self.session, "--rows", str(rows), "--label", label,
               "--queries", str(queries)]
        if pace is not None:
            cmd += ["--iterate", "--pace", pace]
        if not header:
            cmd += ["--no-header"]
        self.err = os.path.join(OUT, f"client-{label}.err")
        self.proc = spawn(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=open(self.err, "w"), text=True,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            kind, _, payload = line.strip().partition(" ")
            if kind == "STARTED":
                self.started.set()
            elif kind == "WAITING":
                self.waiting.set()
            elif kind in ("DONE", "ERROR"):
                self.result = {"kind": kind, **json.loads(payload)}
            elif kind == "STOP-ERROR":
                self.stop_error = json.loads(payload)
        self.proc.wait()
        self.ended_at = time.monotonic()
        self.started.set()
        self.waiting.set()

    def go(self):
        """Starts the next read of a client that is WAITING."""
        self.waiting.clear()
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def wait(self, timeout):
        self.thread.join(timeout)
        if self.thread.is_alive():
            self.proc.kill()
            self.thread.join(10)
            raise AssertionError(f"{self.label}: still running after {timeout} s")
        return self.result

    def read_all(self):
        """Whether it ended DONE with every id once."""
        r, n = self.result or {}, self.rows
        return (self.proc.returncode == 0 and r.get("kind") == "DONE"
                and r.get("rows") == n and r.get("sum") == n * (n - 1) // 2)

    def describe(self):
        if self.result is None:
            with open(self.err) as f:
                tail = f.read()[-1500:]
            return f"exit {self.proc.returncode}, no result line; stderr: {tail}"
        r = self.result
        if r["kind"] == "DONE":
            return f"{r['rows']} rows, sum {r['sum']}, {r['seconds']:.2f} s"
        return json.dumps(r, sort_keys=True)


def run_clients(python, port, prefix, n, rows=ROWS, timeout=180):
    clients = [Client(python, port, f"{prefix}{i}", rows) for i in range(n)]
    for c in clients:
        c.wait(timeout)
    return clients


def paced_clients(python, port, prefix, n):
    """`n` slow readers, returned once each has its first rows."""
    clients = [Client(python, port, f"{prefix}{i}", pace=PACE) for i in range(n)]
    for c in clients:
        if not c.started.wait(60) or c.result is not None:
            raise AssertionError(f"{c.label} did not start reading: {c.describe()}")
    return clients


def served_by(replicas, sessions):
    """Replica name -> the sessions of `sessions` its current process ran executions for."""
    return {r.name: r.sessions() & set(sessions) for r in replicas}


def show_routing(proxy, replicas, sessions):
    """Prints and checks where `sessions` ran (the events logs, written asynchronously:
    waits until each session shows up in one) and what the stick table holds."""
    def settled():
        served = served_by(replicas, sessions)
        return served if set().union(*served.values()) >= set(sessions) else None
    try:
        served = wait_until("every session in an events log", 5, settled)
    except AssertionError:
        served = served_by(replicas, sessions)
    table = proxy.table()
    for r in replicas:
        stuck = sum(1 for s in sessions if table.get(s) == r.name)
        print(f"   {r.name}: ran {len(served[r.name])} of these {len(sessions)} sessions "
              f"(HAProxy's stick table maps {stuck} to it)", flush=True)
    both = [s for s in sessions if sum(s in v for v in served.values()) > 1]
    check(not both, f"each session ran on one replica only ({len(both)} on both)")
    return served


# ---------------------------------------------------------------------------------------------
# The parts
# ---------------------------------------------------------------------------------------------

def part1(python, proxy, replicas):
    stray = Client(python, proxy.port, "p1-no-header", rows=10, header=False)
    r = stray.wait(60) or {}
    details = re.search(r'details = "([^"]*)"', r.get("message", ""))
    check(r.get("grpc_code") == "FAILED_PRECONDITION",
          f"a client without the header is refused by HAProxy at once ({r.get('seconds')} s): "
          f"{r.get('class')} {r.get('grpc_code')}: "
          f"{details.group(1) if details else stray.describe()}")
    clients = run_clients(python, proxy.port, "p1-", CLIENTS)
    for c in clients:
        check(c.read_all(), f"{c.label} read range({ROWS}) once: {c.describe()}")
    served = show_routing(proxy, replicas, [c.session for c in clients])
    time.sleep(1.2)  # the stats lines (every 200 ms) and the published counters (1 s)
    for r in replicas:
        reattaches = int(r.metrics().get("tether_connect_reattaches_total", 0))
        print(f"   {r.name}: {r.stats_text()}; reattaches={reattaches}", flush=True)
        check(r.stat("created") > 0 and served[r.name],
              f"{r.name} served sessions: created={r.stat('created')}, "
              f"{len(served[r.name])} sessions")
        check(reattaches > 0, f"{r.name}: streams rotated, {reattaches} reattaches")
        for condition in NOT_FOUND:
            count = r.errors(condition)
            check(count == 0, f"{r.name}: {count} answers {condition}")


def part2(python, proxy, replicas):
    r1, r2 = replicas
    clients = paced_clients(python, proxy.port, "p2-", CLIENTS)
    table = proxy.table()
    on = {r.name: [c for c in clients if table.get(c.session) == r.name] for r in replicas}
    print(f"   all {len(clients)} reading (0.1 s per batch of 10000 rows): {len(on['r1'])} "
          f"through r1, {len(on['r2'])} through r2", flush=True)
    if not (on["r1"] and on["r2"]):
        raise AssertionError("the clients did not reach both replicas")
    killed_at, killed_wall = time.monotonic(), time.time()
    r1.proc.send_signal(signal.SIGKILL)
    r1.proc.wait()
    # On a loaded machine a client of r1 may have read everything before the kill.
    early = [c for c in on["r1"] if c.result is not None]
    for c in early:
        check(c.read_all(), f"{c.label} (r1) read everything before the kill: {c.describe()}")
    on["r1"] = [c for c in on["r1"] if c not in early]
    print(f"   r1 killed (SIGKILL) while {len(on['r1'])} of its clients were reading",
          flush=True)
    if not on["r1"]:
        raise AssertionError("no client of r1 was still reading when it was killed")
    down = []
    threading.Thread(target=lambda: down.append(
        proxy.wait_status("r1", "DOWN") and time.monotonic() - killed_at), daemon=True).start()
    for c in clients:
        c.wait(120)
    raised, ended = [], []
    for c in on["r1"]:
        r = c.result or {}
        error = r.get("at", float("inf")) - killed_wall
        after = c.ended_at - killed_at
        raised.append(error)
        ended.append(after)
        print(f"   {c.label} (r1): error {error:.2f} s after the kill (process ended after "
              f"{after:.2f} s, spark.stop() included), {r.get('rows')} rows read: "
              f"{r.get('class')} {r.get('condition') or r.get('grpc_code')}: "
              f"{r.get('message')}", flush=True)
        check(r.get("kind") == "ERROR" and after < FAIL_WITHIN,
              f"{c.label} ended with an error within {FAIL_WITHIN:.0f} s")
    for c in on["r2"]:
        check(c.read_all(), f"{c.label} (r2) read range({ROWS}) once: {c.describe()}")
    marked = f"{down[0]:.2f} s" if down else "not yet"
    print(f"   r1's clients: errors {min(raised):.2f} .. {max(raised):.2f} s after the kill, "
          f"processes ended {min(ended):.2f} .. {max(ended):.2f} s after it; HAProxy marked "
          f"r1 DOWN after {marked}; r2 has answered SESSION_NOT_FOUND "
          f"{r2.errors(NOT_FOUND[1])} times, OPERATION_NOT_FOUND {r2.errors(NOT_FOUND[0])} "
          f"times", flush=True)

    restarted = time.monotonic()
    r1.start()
    proxy.wait_status("r1", "UP")
    print(f"   r1 restarted on the same port ({r1.port}), UP in HAProxy after "
          f"{time.monotonic() - restarted:.2f} s", flush=True)
    fresh = run_clients(python, proxy.port, "p2-new-", 4)
    for c in fresh:
        check(c.read_all(), f"{c.label} (a new session) read range({ROWS}) once: "
                            f"{c.describe()}")
    served = show_routing(proxy, replicas, [c.session for c in fresh])
    check(len(served["r1"]) > 0, f"the restarted r1 serves new sessions ({len(served['r1'])}"
                                 f" of {len(fresh)}, r2 {len(served['r2'])})")


def part3(python, proxy, replicas):
    r1, r2 = replicas
    # A session of r1 between two queries: it read once, and starts its second read only
    # once r1 drains.
    for attempt in range(4):
        idle = Client(python, proxy.port, f"p3-idle-{attempt}", rows=200_000, queries=2)
        idle.waiting.wait(60)
        if proxy.table().get(idle.session) == "r1":
            break
        idle.proc.kill()
    else:
        raise AssertionError("no idle session on r1")
    clients = paced_clients(python, proxy.port, "p3-", 4)
    table = proxy.table()
    running = [c for c in clients if table.get(c.session) == "r1"]
    print(f"   {len(clients)} clients reading, {len(running)} through r1; one session of r1 "
          f"idle between two queries", flush=True)
    if not running:
        raise AssertionError("no client reads through r1")
    answer = proxy.command(f"set server {BACKEND}/r1 state drain").strip()
    proxy.wait_status("r1", "DRAIN", 5)
    before = r1.sessions()
    termed_at, termed_wall = time.monotonic(), time.time()
    r1.proc.send_signal(signal.SIGTERM)
    print(f"   set server {BACKEND}/r1 state drain ({answer or 'done'}); SIGTERM to r1",
          flush=True)
    idle.go()
    fresh = run_clients(python, proxy.port, "p3-new-", 4, rows=200_000)
    for c in fresh:
        check(c.read_all(), f"{c.label} (a new session during the drain) read range(200000) "
                            f"once: {c.describe()}")
    sessions = {c.session for c in fresh}
    try:
        wait_until("the new sessions in r2's events log", 5, lambda: sessions <= r2.sessions())
    except AssertionError:
        pass
    new_on_r1, new_on_r2 = (r1.sessions() - before) & sessions, r2.sessions() & sessions
    check(not new_on_r1 and len(new_on_r2) == len(fresh),
          f"new sessions went to r2 ({len(new_on_r2)} of {len(fresh)}; r1 {len(new_on_r1)})")
    for c in clients:
        c.wait(120)
    for c in clients:
        where = "r1, draining" if c in running else "r2"
        check(c.read_all(), f"{c.label} ({where}) read range({ROWS}) once: {c.describe()}")
        if c.stop_error:
            print(f"   {c.label}: spark.stop() failed: {c.stop_error}", flush=True)
    try:
        code = r1.proc.wait(DRAIN_TIMEOUT_MS / 1000 + 30)
    except subprocess.TimeoutExpired:
        code = None
    check(code == 0, f"r1 exited {code} {time.monotonic() - termed_at:.2f} s after SIGTERM "
                     f"(its last stats: {r1.stats_text()})")
    if r1.drained is not None:
        report = " ".join(f"{k}={v}" for k, v in r1.drained.items())
        check(r1.drained.get("canceled") == "0" and r1.drained.get("left") == "0",
              f"r1's drain canceled and left nothing: drained {report}")
    # How the drain looks to a session of r1 that starts a new query meanwhile (PySpark
    # retries the refusal; once r1 is gone, HAProxy sends it to r2, where the session is
    # not).
    idle.wait(120)
    r = idle.result or {}
    outcome = " ".join(str(r[k]) for k in ("kind", "class", "condition", "grpc_code")
                       if r.get(k))
    print(f"   {idle.label} (r1, a new query sent right after the SIGTERM): "
          f"{r.get('at', float('nan')) - termed_wall:.2f} s after the SIGTERM, {outcome}: "
          f"{r.get('message') or idle.describe()}", flush=True)
    runs = r1.started().count(idle.session)
    check(runs == 1, f"r1 started no execution of an existing session during the drain "
                     f"({runs - 1})")
    # The rest of a rolling restart: the new process, then `ready` again.
    r1.start()
    proxy.wait_status("r1", "DRAIN")
    answer = proxy.command(f"set server {BACKEND}/r1 state ready").strip()
    proxy.wait_status("r1", "UP")
    print(f"   r1 restarted; set server {BACKEND}/r1 state ready ({answer or 'done'})",
          flush=True)
    after = run_clients(python, proxy.port, "p3-after-", 2, rows=200_000)
    for c in after:
        check(c.read_all(), f"{c.label} (after the restart) read range(200000) once: "
                            f"{c.describe()}")
    served = show_routing(proxy, replicas, [c.session for c in after])
    check(len(served["r1"]) > 0, "the restarted r1, set ready, serves new sessions again")


def drain_flags(binary):
    """The example server's drain flags (`--drain…` in its --help); empty without a drain."""
    text = subprocess.run([binary, "--help"], capture_output=True, text=True).stdout
    return sorted(set(re.findall(r"--drain[\w-]*", text)))


def stop_all():
    for proc in reversed(PROCESSES):
        if proc.poll() is None:
            proc.terminate()
    for proc in reversed(PROCESSES):
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary")
    parser.add_argument("python")
    parser.add_argument("--haproxy", default=shutil.which("haproxy") or "haproxy")
    args = parser.parse_args()
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    began = time.monotonic()
    drain = drain_flags(args.binary)
    extra = ["--drain-timeout-ms", str(DRAIN_TIMEOUT_MS)] if "--drain-timeout-ms" in drain \
        else []
    # SIGTERM (scripts/replicas.sh's trap) unwinds through the cleanup below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        with Part("start two replicas and HAProxy"):
            replicas = [Replica(name, args.binary, extra).start() for name in ("r1", "r2")]
            proxy = HAProxy(args.haproxy, replicas).start()
            for r in replicas:
                proxy.wait_status(r.name, "UP")
            version = subprocess.run([args.haproxy, "-v"], capture_output=True, text=True)
            print(f"   {version.stdout.splitlines()[0]}", flush=True)
            print(f"   HAProxy on 127.0.0.1:{proxy.port}: r1 on 127.0.0.1:{replicas[0].port}, "
                  f"r2 on 127.0.0.1:{replicas[1].port} ({os.path.relpath(proxy.config, REPO)})",
                  flush=True)
        if FAILURES:
            return 1
        with Part(f"part 1: {CLIENTS} sessions read range({ROWS}) through HAProxy"):
            part1(args.python, proxy, replicas)
        with Part("part 2: r1 killed (SIGKILL) mid-query, then restarted"):
            part2(args.python, proxy, replicas)
        if drain:
            with Part(f"part 3: r1 drained mid-query (HAProxy DRAIN, SIGTERM; {drain})"):
                part3(args.python, proxy, replicas)
        else:
            print("== part 3: SKIPPED: examples/connect_server has no drain yet (no --drain "
                  "flag in its --help)", flush=True)
    finally:
        stop_all()
    print(f"replicas: {len(FAILURES)} failed checks in {time.monotonic() - began:.1f} s; "
          f"the HAProxy config and every log in {os.path.relpath(OUT, REPO)}/", flush=True)
    for what in FAILURES:
        print(f"  FAILED: {what}")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
