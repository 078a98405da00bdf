#!/usr/bin/env bash
# Line coverage of one cargo-fuzz target over its corpus and seeds (opt-in, not in CI):
#   bash scripts/fuzz-coverage.sh [TARGET [SOURCE...]]
# Default: the framed I/O-schedule target over the framed transport's read and write paths
# and the frame codec (issue 12's Must-show). Needs the nightly toolchain; installs its
# llvm-tools component if missing. Run `bash scripts/fuzz.sh` first to grow the local corpus.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
target="${1:-framed_io}"
shift || true
if [[ $# -eq 0 ]]; then
  set -- src/connection/framed/read.rs src/connection/framed/write.rs src/wire/codec.rs
fi
sysroot=$(rustc +nightly --print sysroot)
host=$(rustc +nightly -vV | sed -n 's/^host: //p')
llvm="$sysroot/lib/rustlib/$host/bin"
if [[ ! -x "$llvm/llvm-cov" ]]; then
  rustup component add llvm-tools-preview --toolchain nightly
fi
cd fuzz
mkdir -p "corpus/$target" "seeds/$target"
rm -rf "coverage/$target"
cargo +nightly fuzz coverage "$target" "corpus/$target" "seeds/$target" >/dev/null
bin="target/$host/coverage/$host/release/$target"
echo "inputs: $(ls "corpus/$target" "seeds/$target" | grep -vc ':$\|^$')"
"$llvm/llvm-cov" report "$bin" -instr-profile="coverage/$target/coverage.profdata" \
  "${@/#/$root/}" | awk '{ printf "%-32s lines %5s, missed %4s (%s)\n", $1, $8, $9, $10 }' \
  | grep -v "^-\|^Filename"
