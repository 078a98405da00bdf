#!/usr/bin/env bash
# Runs the opt-in soak (issue 11 item 6, tests/faults/soak.rs): worker sessions on real worker
# processes over the framed and gRPC transports and reattachable executions through the
# Spark Connect service, under random faults, for SECONDS (default 600) after a warm-up;
# prints the load average before and after and the soak's report.
#
#   bash scripts/soak.sh          # 10 minutes: 10 000 sessions, 1 000 executions
#   bash scripts/soak.sh 60       # one minute, counts scaled down
#   TETHER_SOAK_SEED=7 bash scripts/soak.sh 60   # repeat a run's random choices
#
# The same as `TETHER_SOAK_SECS=SECONDS cargo test --release --all-features --test faults --
# --ignored --exact soak::soak`,
# built for the soak's target alone and run from its binary. With CARGO_BUILD_LOCK set to a
# lock file (a machine shared by several builds), the build runs under `flock` on it; the run
# does not hold it.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-600}"
lock=()
if [[ -n "${CARGO_BUILD_LOCK:-}" ]]; then lock=(flock "$CARGO_BUILD_LOCK"); fi

built="$("${lock[@]}" cargo test --release --all-features --test faults --no-run 2>&1)" || {
  echo "$built"
  exit 1
}
# "Executable tests/faults/main.rs (target/release/deps/faults-…)"
binary="$(sed -n 's/.*Executable tests\/faults\/main\.rs (\(.*\))$/\1/p' <<<"$built" | tail -1)"
[[ -x "$binary" ]] || { echo "$built"; echo "soak.sh: no soak binary found" >&2; exit 1; }
echo "load average before: $(cat /proc/loadavg)"
status=0
TETHER_SOAK_SECS="$secs" "$binary" --ignored --exact soak::soak --nocapture || status=$?
echo "load average after: $(cat /proc/loadavg)"
exit "$status"
