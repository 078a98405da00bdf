#!/usr/bin/env bash
# The crate as crates.io and docs.rs would get it (CI-only step of .ci/run; runs by hand too).
#
# 1. `cargo package --list`: the packaged files are exactly what users and docs.rs need —
#    the library's sources, build script, protocol reference (rendered as
#    `tether::reference`), examples, README, LICENSE, CHANGELOG, docs/benchmarks.md and
#    docs/deployment.md — and
#    no test data,
#    scripts, benches or fuzz corpora.
# 2. `cargo publish --dry-run --all-features`: packs the crate and builds it from the package
#    alone, with every feature (docs.rs builds the gated modules too). Cargo's notes that the
#    tests and benches it leaves out are not in the package are counted, not printed.
#
# Extra arguments go to both cargo commands (e.g. --allow-dirty for a work tree with changes).
set -euo pipefail
cd "$(dirname "$0")/.."
list=$(cargo package --list --quiet "$@")
problems=()
for required in Cargo.toml src/lib.rs build.rs README.md LICENSE CHANGELOG.md \
  docs/reference/udf-worker-protocol.md docs/reference/reattach-protocol.md \
  docs/reference/spark-connect.md docs/diagrams/engine-session.md docs/benchmarks.md \
  docs/deployment.md examples/tour/main.rs \
  examples/data/penguins.csv; do
  grep -qxF "$required" <<<"$list" || problems+=("missing: $required")
done
while IFS= read -r file; do
  case "$file" in
    Cargo.toml | Cargo.toml.orig | Cargo.lock | .cargo_vcs_info.json | build.rs | README.md | \
      LICENSE | CHANGELOG.md | src/* | examples/* | docs/reference/*.md | docs/diagrams/*.md | \
      docs/benchmarks.md | docs/deployment.md) ;;
    *) problems+=("not for the package: $file") ;;
  esac
done <<<"$list"
if [ "${#problems[@]}" -gt 0 ]; then
  printf 'package: %s\n' "${problems[@]}" >&2
  exit 1
fi
echo "package: $(wc -l <<<"$list") files, as intended"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo publish --dry-run --all-features "$@" >"$log" 2>&1 || status=$?
left_out='^warning: ignoring (test|benchmark) `[a-z_]+` as `(tests|benches)/.*` is not included in the published package$'
grep -vE "$left_out" "$log" || true
echo "package: $(grep -cE "$left_out" "$log") test and bench targets left out of the package, as intended"
exit "$status"
