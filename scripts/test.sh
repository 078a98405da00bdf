#!/usr/bin/env bash
# The test command (README): every test suite of the crate, with all features.
# Extra arguments are passed to `cargo test` (e.g. a test-name filter).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --all-features "$@"
