# Shared by scripts/python-env.sh and scripts/pyspark-env.sh (sourced, not run): the pinned
# venv under target/ that a Python peer of the tests runs in.
#
#   venv_begin LABEL VENV REQUIREMENTS WHAT   # returns 1 if VENV is up to date (nothing to do)
#   ... install into "$venv" with "${pip[@]}", calling venv_unavailable on failure ...
#   venv_done                                 # records the stamp
#
# The stamp holds the requirements file's SHA-256 and the interpreter version, so the venv is
# rebuilt only when either changes. Without python3, or when an install fails, the tests that
# need the venv report themselves SKIPPED (exit 0), except under CI=true (exit 1). Set
# TETHER_PYTHON3 to use another base interpreter.

venv_unavailable() {
  echo "$venv_label: $*" >&2
  rm -rf "$venv"
  if [ "${CI:-}" = "true" ]; then
    echo "$venv_label: FAILED (CI=true): $venv_what cannot run" >&2
    exit 1
  fi
  echo "$venv_label: WARNING: $venv_what will be SKIPPED" >&2
  exit 0
}

venv_begin() {
  venv_label=$1 venv=$2 requirements=$3 venv_what=$4
  venv_stamp=$venv/.tether-requirements
  local base=${TETHER_PYTHON3:-python3} version
  command -v "$base" >/dev/null 2>&1 || venv_unavailable "no '$base' on PATH"
  version=$("$base" -c 'import sys; print(sys.version.split()[0])') ||
    venv_unavailable "'$base' does not run"
  venv_want="$(sha256sum "$requirements" | cut -d' ' -f1) python-$version"
  if [ -x "$venv/bin/python" ] && [ "$(cat "$venv_stamp" 2>/dev/null)" = "$venv_want" ]; then
    echo "$venv_label: $venv is up to date ($venv_want)"
    return 1
  fi
  echo "$venv_label: creating $venv with $requirements (python $version)"
  rm -rf "$venv"
  "$base" -m venv "$venv" || venv_unavailable "'$base -m venv' failed"
  pip=("$venv/bin/python" -m pip --disable-pip-version-check --no-input)
}

venv_done() {
  echo "$venv_want" >"$venv_stamp"
}
