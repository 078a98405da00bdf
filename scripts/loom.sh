#!/usr/bin/env bash
# Model-checks tether's shared state with loom (tests/loom.rs): the crate is rebuilt with
# `--cfg tether_loom`, under which src/sync.rs swaps loom's locks and atomics in, and every
# interleaving of each model's threads is explored up to LOOM_MAX_PREEMPTIONS preemptions.
#
# The cfg changes every crate's build flags, so it builds in its own target directory
# (target/loom, release: loom runs each model thousands of times); the first run rebuilds
# the dev-dependencies there. Extra arguments go to the test binary (e.g. a test-name
# filter). With CARGO_BUILD_LOCK set to a file, the build and the run hold `flock` on it
# (a machine shared by several builds).
set -euo pipefail
cd "$(dirname "$0")/.."

export RUSTFLAGS="${RUSTFLAGS:-} --cfg tether_loom"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR_LOOM:-$PWD/target/loom}"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}"

run() {
  if [[ -n "${CARGO_BUILD_LOCK:-}" ]]; then
    flock "$CARGO_BUILD_LOCK" "$@"
  else
    "$@"
  fi
}

start=$(date +%s)
run cargo test --release --test loom --no-run
built=$(date +%s)
echo "loom: built in $(( built - start )) s"
run cargo test --release --test loom -- --test-threads=1 --nocapture "$@"
echo "loom: models checked in $(( $(date +%s) - built )) s (LOOM_MAX_PREEMPTIONS=$LOOM_MAX_PREEMPTIONS)"
