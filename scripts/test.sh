#!/usr/bin/env bash
# The test command (README): every test suite of the workspace, with all features.
# Extra arguments are passed to `cargo test` (e.g. a test-name filter).
set -euo pipefail
cd "$(dirname "$0")/.."
# The Python peer of the wire-conformance tests (tests/conformance/): a venv with pinned
# packages and the classes generated from the official .proto files.
bash scripts/python-env.sh
export TETHER_PYTHON="${TETHER_PYTHON:-$PWD/target/py-venv/bin/python}"
# The real Spark Connect Python client (pyspark-client) for tests/rx/pyspark_connect.rs.
bash scripts/pyspark-env.sh
export TETHER_PYSPARK_PYTHON="${TETHER_PYSPARK_PYTHON:-$PWD/target/pyspark-venv/bin/python}"
# Every crate of the workspace: the library, tether-testing and the compile-fail cases.
cargo test --workspace --all-features "$@"
