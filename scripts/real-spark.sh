#!/usr/bin/env bash
# The CI-only real-Spark step (.ci/run runs it after the test command; it also runs by hand):
# tether's Spark Connect client and server against the real Spark 4.3.0 server on loopback,
# started by scripts/spark-oracle.sh (which fetches Spark 4.3.0 from PyPI into the cache,
# ~/.cache/tether, on first use, checked by SHA-256). What it checks: scripts/real_spark.py.
#
# Needs java 17, python3 and the pyspark-client venv (built here by scripts/pyspark-env.sh).
# It never skips: without any of them it fails, saying what is missing. About 3 minutes,
# plus the Spark download on a cold cache.
set -euo pipefail
cd "$(dirname "$0")/.."
missing() { echo "real-spark: FAILED: $1" >&2; exit 1; }
command -v java >/dev/null || missing "no java on PATH (the Spark 4.3.0 server needs java 17)"
command -v python3 >/dev/null || missing "no python3 on PATH"
bash scripts/spark-oracle.sh home >/dev/null || missing "the Spark 4.3.0 distribution (see the lines above)"
bash scripts/pyspark-env.sh
python=$PWD/target/pyspark-venv/bin/python
[ -x "$python" ] || missing "no pyspark-client venv at target/pyspark-venv (see the lines above)"
target=${CARGO_TARGET_DIR:-$PWD/target}
# The features of the test command, so its build is reused.
cargo build --all-features --example connect_test_server --example connect_client
started=$(date +%s)
status=0
python3 scripts/real_spark.py "$target/debug" "$python" || status=$?
echo "real-Spark step: exit $status after $(( $(date +%s) - started )) s"
exit "$status"
