#!/usr/bin/env bash
# Runs every cargo-fuzz target of fuzz/ for SECONDS each (default 30), with the committed
# seeds (fuzz/seeds/<target>/) and the local, uncommitted corpus (fuzz/corpus/<target>/).
# Installs the pinned cargo-fuzz if it is missing; needs the nightly toolchain. Fails if
# any target finds a crash (the input is left in fuzz/artifacts/<target>/).
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_TARGET="${1:-30}"
CARGO_FUZZ_VERSION=0.13.2

if ! cargo fuzz --version 2>/dev/null | grep -q "$CARGO_FUZZ_VERSION"; then
  echo "== installing cargo-fuzz $CARGO_FUZZ_VERSION =="
  cargo install --locked --version "$CARGO_FUZZ_VERSION" cargo-fuzz
fi

cd fuzz
# The committed fuzz/Cargo.lock is what builds: a lock file the build would rewrite fails
# here (refresh it with `cargo metadata --manifest-path fuzz/Cargo.toml >/dev/null`).
cargo +nightly metadata --locked --format-version 1 >/dev/null
start=$(date +%s)
cargo +nightly fuzz build -O
echo "fuzz crate built in $(( $(date +%s) - start )) s"

failed=()
for target in $(cargo +nightly fuzz list); do
  mkdir -p "corpus/$target" "seeds/$target"
  t0=$(date +%s)
  log="target/fuzz-$target.log"
  mkdir -p target
  if cargo +nightly fuzz run -O "$target" "corpus/$target" "seeds/$target" -- \
      -max_total_time="$SECONDS_PER_TARGET" -print_final_stats=1 >"$log" 2>&1; then
    status=ok
  else
    status=FAILED
    failed+=("$target")
    tail -n 40 "$log"
  fi
  runs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$' || echo "?")
  echo "fuzz $target: $status, $runs runs in $(( $(date +%s) - t0 )) s"
done

if (( ${#failed[@]} )); then
  echo "fuzz: crashes in ${failed[*]}"
  exit 1
fi
echo "fuzz: every target ran ${SECONDS_PER_TARGET} s without a crash"
