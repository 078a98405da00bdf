#!/usr/bin/env bash
# The public-API listing (CI-only: it needs nightly rustdoc's JSON output).
#
# Lists every public path of the crate (all features) into target/public-api.txt, fails if
# an item has more than one path, and compares the listing with the committed
# docs/public-api.txt, so every change to the public surface shows in review.
# `bash scripts/public-api.sh --bless` rewrites the committed listing.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
cargo +nightly rustdoc --lib --all-features -q -- -Z unstable-options --output-format json
python3 scripts/public_api.py "$target/doc/tether.json" > "$target/public-api.txt"
if [[ "${1:-}" == "--bless" ]]; then
    cp "$target/public-api.txt" docs/public-api.txt
    echo "docs/public-api.txt updated"
    exit 0
fi
if ! diff -u docs/public-api.txt "$target/public-api.txt"; then
    echo "the public API changed: review the diff above, then run bash scripts/public-api.sh --bless" >&2
    exit 1
fi
