#!/usr/bin/env bash
# The CI-only replicas step (.ci/run runs it after the real-Spark step; it also runs by hand):
# two test servers (tests/support/test_server, examples/connect_server with stats lines) behind a real HAProxy (Debian's package), read by the
# real PySpark client: sessions spread over both and each kept on one (part 1), a replica
# killed mid-query and restarted (part 2), a replica drained (part 3, skipped while the
# example has no drain). What it checks and prints: scripts/replicas.py; the deployment it
# builds: docs/deployment.md. About a minute after the builds.
#
# Installs HAProxy with apt-get when it is missing (as root, or through sudo), builds the
# example server (release) and the pyspark-client venv (scripts/pyspark-env.sh). It never
# skips: without any of them it fails, saying what is missing. Everything it writes is under
# target/replicas/; every process it starts is ended on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
missing() { echo "replicas: FAILED: $1" >&2; exit 1; }

if ! command -v haproxy >/dev/null; then
  echo "replicas: installing HAProxy from the Debian packages (apt-get install -y haproxy)"
  sudo=()
  [ "$(id -u)" = 0 ] || sudo=(sudo)
  command -v apt-get >/dev/null || missing "no haproxy on PATH and no apt-get to install it"
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q haproxy >/dev/null ||
    { "${sudo[@]}" apt-get update -q >/dev/null &&
      "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q haproxy >/dev/null; } ||
    missing "apt-get install haproxy failed"
fi
haproxy=$(command -v haproxy) || missing "no haproxy on PATH after the install"
command -v python3 >/dev/null || missing "no python3 on PATH"
bash scripts/pyspark-env.sh
python=$PWD/target/pyspark-venv/bin/python
[ -x "$python" ] || missing "no pyspark-client venv at target/pyspark-venv (see the lines above)"
target=${CARGO_TARGET_DIR:-$PWD/target}
cargo build --release --all-features --example connect_test_server
server=$target/release/examples/connect_test_server

# scripts/replicas.py ends what it starts; this trap is the backstop (the orchestrator
# killed, or this script interrupted): every process whose pid it recorded, if still one of
# ours (the server, HAProxy or a client of this step).
orchestrator=
cleanup() {
  if [ -n "$orchestrator" ] && kill -0 "$orchestrator" 2>/dev/null; then
    kill -TERM "$orchestrator" 2>/dev/null || true
    wait "$orchestrator" 2>/dev/null || true
  fi
  [ -f target/replicas/pids ] || return 0
  while read -r pid; do
    if grep -qsE 'connect_test_server|haproxy|replica_client' "/proc/$pid/cmdline"; then
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done <target/replicas/pids
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

started=$(date +%s)
status=0
python3 scripts/replicas.py "$server" "$python" --haproxy "$haproxy" &
orchestrator=$!
wait "$orchestrator" || status=$?
orchestrator=
echo "replicas step: exit $status after $(( $(date +%s) - started )) s"
exit "$status"
