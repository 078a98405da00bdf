#!/usr/bin/env bash
# Sets up the real Spark Connect Python client for tests/rx/pyspark_connect.rs: a venv at
# target/pyspark-venv with exactly the packages pinned in tests/python/pyspark-requirements.txt
# (pyspark-client 4.2.0 and its dependencies). Called by scripts/test.sh before `cargo test`;
# safe to run any time.
#
# Idempotent: the venv is (re)created only when it is missing, or when the requirements file
# or the Python version changed since it was built (a stamp file holds the requirements'
# SHA-256 and the interpreter version). pyspark-client is published as a source distribution
# only (pure Python): it is built from source with --no-build-isolation against the pinned
# setuptools; everything else installs from wheels. After the install the venv must hold
# exactly the pinned set (pip check, and pip freeze compared with the file).
#
# Without python3 (or when the install fails) it says so loudly and exits 0, so the rest of
# the test suite still runs and the PySpark tests report themselves SKIPPED; under CI=true it
# exits 1 instead (scripts/venv-lib.sh). Set TETHER_PYTHON3 to use another base interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/venv-lib.sh
venv_begin pyspark-env target/pyspark-venv tests/python/pyspark-requirements.txt \
  "the PySpark client tests" || exit 0
setuptools=$(grep -E '^setuptools==' "$requirements") ||
  venv_unavailable "no setuptools pin in $requirements"
# The build backend for pyspark-client first (no build isolation: it builds against this one).
"${pip[@]}" install --quiet --only-binary=:all: "$setuptools" ||
  venv_unavailable "pip install $setuptools failed"
"${pip[@]}" install --quiet --only-binary=:all: --no-binary=pyspark-client \
  --no-build-isolation -r "$requirements" || venv_unavailable "pip install -r $requirements failed"
"${pip[@]}" check || venv_unavailable "the pinned packages are inconsistent"
# Nothing unpinned slipped in: the installed set is exactly the file's.
"$venv/bin/python" - "$requirements" <<'EOF' || venv_unavailable "the venv differs from $requirements"
import importlib.metadata as md, re, sys

def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()

pinned = {}
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if line:
        name, _, version = line.partition("==")
        pinned[norm(name)] = version
installed = {norm(d.metadata["Name"]): d.version for d in md.distributions()}
installed.pop("pip", None)
if installed != pinned:
    extra = {k: v for k, v in installed.items() if pinned.get(k) != v}
    missing = {k: v for k, v in pinned.items() if installed.get(k) != v}
    print(f"pyspark-env: installed but not pinned: {extra}; pinned but not installed: {missing}",
          file=sys.stderr)
    sys.exit(1)
EOF
venv_done
echo "pyspark-env: $venv ready"
