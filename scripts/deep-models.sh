#!/usr/bin/env bash
# Runs tether's core models deep (issue 11 item 1): each proptest-state-machine model with
# TETHER_MODEL_CASES cases (default 100000), in release mode, one after the other, printing
# per model its cases, time, cases/s, the load average and the delivery tally ("N responses
# checked ...: 0 lost, 0 duplicated").
#
#   bash scripts/deep-models.sh            # 100000 cases per model
#   bash scripts/deep-models.sh 20000      # fewer
#
# The registry's model (proptest-state-machine inside the crate: the registry is
# crate-private; no delivery tally) runs last.
#
# On a machine shared by several builds, set CARGO_BUILD_LOCK to a lock file (as for
# scripts/loom.sh): the build then runs under `flock` on it.
set -euo pipefail
cd "$(dirname "$0")/.."
cases="${1:-100000}"
lock=()
if [[ -n "${CARGO_BUILD_LOCK:-}" ]]; then lock=(flock "$CARGO_BUILD_LOCK"); fi

# test target : test name
models=(
  "udf:core_model::engine_core_matches_reference_model"
  "udf:worker_core_model::worker_core_matches_reference_model"
  "rx:server_model::rx_model_server_matches_reference"
  "rx:client_model::client_core_matches_reference_model"
  "lib:execution::registry::tests::registry_matches_the_model"
)

targets() {
  for m in "${models[@]}"; do echo "${m%%:*}"; done | sort -u | while read -r target; do
    if [[ $target == lib ]]; then printf -- '--lib '; else printf -- '--test %s ' "$target"; fi
  done
}
# shellcheck disable=SC2046
"${lock[@]}" cargo test --release --all-features --no-run $(targets)

total_start=$(date +%s)
log=$(mktemp)
for m in "${models[@]}"; do
  target="${m%%:*}"
  name="${m#*:}"
  start=$(date +%s)
  status=0
  if [[ $target == lib ]]; then sel=(--lib); else sel=(--test "$target"); fi
  TETHER_MODEL_CASES="$cases" "${lock[@]}" cargo test --release --all-features "${sel[@]}" \
    -- --exact "$name" --nocapture >"$log" 2>&1 || status=$?
  grep -E '^model |test result|panicked' "$log" || cat "$log"
  echo "  $target::$name: $(( $(date +%s) - start )) s wall, loadavg $(cut -d' ' -f1-3 /proc/loadavg), exit $status"
  if [[ $status -ne 0 ]]; then exit "$status"; fi
done
rm -f "$log"
echo "all models: $(( $(date +%s) - total_start )) s"
