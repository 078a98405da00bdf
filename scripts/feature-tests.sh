#!/usr/bin/env bash
# CI-only: the library's tests with no feature and with each user-facing feature alone
# (`tokio` is the default, so the default build is "tokio alone"), so that no test or item
# depends on a feature it does not declare. The README's test command runs them all with
# every feature. cargo-hack (pinned) is installed into target/tools on first use.
#
# The test-support crate (tether-testing) depends on the library with `tokio`, so a test
# build always has it; `cargo clippy --no-default-features --lib` in .ci/run checks the
# library alone without any feature.
set -euo pipefail
cd "$(dirname "$0")/.."

hack_version=0.6.46
tools="$PWD/target/tools"
if ! "$tools/bin/cargo-hack" hack --version 2>/dev/null | grep -q "$hack_version"; then
  cargo install --locked --quiet --root "$tools" cargo-hack --version "$hack_version"
fi
export PATH="$tools/bin:$PATH"
export TETHER_PYTHON="${TETHER_PYTHON:-$PWD/target/py-venv/bin/python}"
export TETHER_PYSPARK_PYTHON="${TETHER_PYSPARK_PYTHON:-$PWD/target/pyspark-venv/bin/python}"
# Each feature alone and none; not all features (the README's test command runs that).
cargo hack test --package spark-tether --each-feature --exclude-features tokio \
  --exclude-all-features "$@"
