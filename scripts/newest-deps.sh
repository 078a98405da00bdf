#!/usr/bin/env bash
# CI-only: the workspace against the newest versions of its dependencies that its
# requirements allow (what a user's crate resolves), warning-free: a copy of the tracked
# files under target/newest-deps, `cargo update` there, then clippy with every feature and
# target, sharing this checkout's target directory (so only the updated crates build).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
copy="$root/target/newest-deps"
rm -rf "$copy"
mkdir -p "$copy"
git ls-files -z | tar --null -T - -cf - | tar -xf - -C "$copy"
cd "$copy"
cargo update 2>&1 | grep -E '^ +(Updating|Adding|Removing) ' || echo "(nothing newer)"
CARGO_TARGET_DIR="$root/target" cargo clippy --workspace --all-targets --all-features -- -D warnings
