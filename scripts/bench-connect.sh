#!/usr/bin/env bash
# The Spark Connect benchmark (docs/benchmarks.md): tether's example server against the
# real Spark 4.3.0 server and a bare tonic baseline, read by the real PySpark client and by
# tether's Rust client, on loopback. What it measures and how: scripts/bench_connect.py.
#
#   bash scripts/bench-connect.sh [--rows N] [--runs R] [--warmup W] [--observability | --tls | --chunking]
#
# Needs java 17 and python3 (Spark itself comes from scripts/spark-oracle.sh); builds the
# examples in release mode and target/pyspark-venv first. About 15 minutes with the defaults
# (5 000 000 rows, 3 warm-up runs, median of 5). Not part of .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
missing() { echo "bench-connect: $1" >&2; exit 1; }
# `--chunking`: PySpark allowing result chunking against PySpark not allowing it, one tether
# server (connect §10). `--observability`: tether with its metrics and events against tether
# without; `--tls`:
# tether over TLS against tether in plaintext (needs openssl). Neither needs Spark.
if [[ " $* " != *" --observability "* && " $* " != *" --tls "* && " $* " != *" --chunking "* ]]; then
  command -v java >/dev/null || missing "no java on PATH (the Spark 4.3.0 server needs java 17)"
  bash scripts/spark-oracle.sh home >/dev/null || missing "no Spark 4.3.0 distribution (see the lines above)"
fi
bash scripts/pyspark-env.sh
python=$PWD/target/pyspark-venv/bin/python
[ -x "$python" ] || missing "no pyspark-client venv at target/pyspark-venv"
target=${CARGO_TARGET_DIR:-$PWD/target}
cargo build --release --features spark-connect --example connect_test_server --example connect_client
"$python" scripts/bench_connect.py "$target/release" "$@"
