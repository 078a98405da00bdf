#!/usr/bin/env bash
# Sets up the Python side of the wire-conformance tests (tests/conformance/): a venv at
# target/py-venv with exactly the packages pinned in tests/python/requirements.txt, and the
# classes generated from Spark's official .proto files (../shared/oracle/udf-protos.sh) under
# target/py-gen/. Called by scripts/test.sh before `cargo test`; safe to run any time.
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

venv=target/py-venv
requirements=tests/python/requirements.txt
stamp=$venv/.tether-requirements

unavailable() {
  echo "python-env: $*" >&2
  rm -rf "$venv"
  if [ "${CI:-}" = "true" ]; then
    echo "python-env: FAILED (CI=true): the Python conformance tests cannot run" >&2
    exit 1
  fi
  echo "python-env: WARNING: the Python conformance tests will be SKIPPED" >&2
  exit 0
}

base=${TETHER_PYTHON3:-python3}
command -v "$base" >/dev/null 2>&1 || unavailable "no '$base' on PATH"
version=$("$base" -c 'import sys; print(sys.version.split()[0])') ||
  unavailable "'$base' does not run"
want="$(sha256sum "$requirements" | cut -d' ' -f1) python-$version"

if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  echo "python-env: $venv is up to date ($want)"
else
  echo "python-env: creating $venv with $requirements (python $version)"
  rm -rf "$venv"
  "$base" -m venv "$venv" || unavailable "'$base -m venv' failed"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
    --only-binary=:all: -r "$requirements" || unavailable "pip install -r $requirements failed"
  "$venv/bin/python" -m pip check --disable-pip-version-check ||
    unavailable "the pinned packages are inconsistent"
  echo "$want" >"$stamp"
fi

gen=$("$venv/bin/python" tests/python/udf_protos.py --generate) ||
  unavailable "generating the Python classes from the official .proto files failed"
echo "python-env: classes generated in $gen"
