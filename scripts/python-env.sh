#!/usr/bin/env bash
# Sets up the Python side of the wire-conformance tests (tests/conformance/): a venv at
# target/py-venv with exactly the packages pinned in tests/python/requirements.txt, and the
# classes generated from Spark's official .proto files under target/py-gen/ (the files are
# fetched, checked and cached by scripts/spark-oracle.sh protos; the Rust schema checks of
# tests/conformance/schema.rs read them too). Called by scripts/test.sh before `cargo test`;
# safe to run any time.
#
# Idempotent: the venv is (re)created only when it is missing, or when requirements.txt or
# the Python version changed since it was built (a stamp file holds the requirements' SHA-256
# and the interpreter version). Wheels only: nothing is compiled.
#
# Without python3 (or when the install fails) it says so loudly and exits 0, so the rest of
# the test suite still runs and the conformance tests report themselves SKIPPED; under
# CI=true it exits 1 instead. Set TETHER_PYTHON3 to use another base interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/venv-lib.sh
if venv_begin python-env target/py-venv tests/python/requirements.txt \
  "the Python conformance tests"; then
  "${pip[@]}" install --quiet --only-binary=:all: -r "$requirements" ||
    venv_unavailable "pip install -r $requirements failed"
  "${pip[@]}" check || venv_unavailable "the pinned packages are inconsistent"
  venv_done
fi

if ! protos=$(bash scripts/spark-oracle.sh protos); then
  # The venv is fine; only the schema is missing, so it stays.
  [ "${CI:-}" = "true" ] && { echo "python-env: FAILED (CI=true): no official .proto files" >&2; exit 1; }
  echo "python-env: WARNING: no official .proto files: the conformance tests will be SKIPPED" >&2
  exit 0
fi
echo "python-env: the official .proto files are in $protos"
gen=$("$venv/bin/python" tests/python/udf_protos.py --generate) ||
  venv_unavailable "generating the Python classes from the official .proto files failed"
echo "python-env: classes generated in $gen"
