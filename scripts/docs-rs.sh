#!/usr/bin/env bash
# The docs.rs build (CI-only: it needs nightly rustdoc). Builds the docs exactly as docs.rs
# will, from `[package.metadata.docs.rs]` in Cargo.toml: the features listed there and the
# rustdoc arguments (`--cfg docsrs`, which turns on rustdoc's `doc_cfg`), with warnings as
# errors. Then checks that feature-gated items show their feature badge.
set -euo pipefail
cd "$(dirname "$0")/.."
read -r features rustdoc_args < <(cargo metadata --format-version 1 --no-deps | python3 -c '
import json, sys
package = next(p for p in json.load(sys.stdin)["packages"] if p["name"] == "spark-tether")
docs_rs = package["metadata"]["docs"]["rs"]
print(",".join(docs_rs["features"]), " ".join(docs_rs["rustdoc-args"]))
')
echo "docs.rs features: $features; rustdoc arguments: $rustdoc_args"
RUSTDOCFLAGS="$rustdoc_args -D warnings" cargo +nightly doc --no-deps --features "$features"

doc="${CARGO_TARGET_DIR:-target}/doc/tether"
# `page feature`: the page of a gated item must say which feature it needs.
missing=0
while read -r page feature; do
    # rustdoc's badge: "Available on <strong>crate feature <code>grpc</code></strong> only."
    # (nested modules combine their parents' conditions into the same sentence).
    if ! grep -oE 'Available on <strong>.{0,400}</strong> only' "$doc/$page" | head -1 \
        | grep -q "<code>$feature</code>"; then
        echo "no \`$feature\` badge on $page" >&2
        missing=1
    fi
done <<'PAGES'
spark/udf_grpc/index.html grpc
spark/udf_grpc/struct.WorkerServer.html grpc
spark/connect/index.html spark-connect
spark/connect/struct.ConnectService.html spark-connect
worker/dispatcher/index.html tokio
worker/dispatcher/struct.Dispatcher.html tokio
connection/framed/index.html tokio
worker/engine/struct.FramedTransport.html tokio
PAGES
if [[ $missing != 0 ]]; then
    echo "feature badges are missing: is doc_cfg enabled under --cfg docsrs (src/lib.rs)?" >&2
    exit 1
fi
echo "docs.rs build: no warnings, feature badges present"
