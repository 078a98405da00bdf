#!/usr/bin/env bash
# The reference the tests compare tether against: Apache Spark 4.3.0 as published on PyPI
# (`pyspark==4.3.0`, a source distribution that carries Spark's jars, bin/ and sbin/),
# fetched once, checked by SHA-256 and cached outside the work tree. Nothing of it is ever
# committed to this repository.
#
#   bash scripts/spark-oracle.sh home             # fetch if needed; print SPARK_HOME
#   bash scripts/spark-oracle.sh protos           # fetch if needed; print the .proto directory
#   bash scripts/spark-oracle.sh protos --cached  # print it only if already fetched (else exit 3)
#   bash scripts/spark-oracle.sh start  [PORT] [--conf k=v ...]   # a Spark Connect server
#   bash scripts/spark-oracle.sh rotate [PORT] [--conf k=v ...]   # the same, streams cut early
#   bash scripts/spark-oracle.sh stop   [PORT]
#
# `protos` is the official schema of the external UDF worker protocol (common.proto,
# udf_message.proto, udf_service.proto, worker_spec.proto; package
# org.apache.spark.udf.worker), extracted from the jar spark-udf-worker-proto inside that
# distribution; each file is checked against its own SHA-256 below on every call.
#
# `start` runs org.apache.spark.sql.connect.service.SparkConnectServer (java 17, `local[2]`,
# 1 GiB driver memory) on 127.0.0.1:PORT (default 15002) and prints `ready 127.0.0.1:PORT`
# once it listens. `rotate` adds senderMaxStreamDuration=1s and senderMaxStreamSize=123
# bytes, as Spark's own reattach tests do, so every stream ends early and clients reattach.
# Log and pid: $cache/connect-server/server-PORT.{log,pid}.
#
# Cache: $TETHER_CACHE, else ${XDG_CACHE_HOME:-$HOME/.cache}/tether. The first call
# downloads 456 MB from files.pythonhosted.org (needs curl or python3) and unpacks about
# 500 MB; later calls read the cache. A checksum mismatch fails: the bad file is removed and
# both digests are printed.
set -euo pipefail

version=4.3.0
sdist=pyspark-$version.tar.gz
sdist_url=https://files.pythonhosted.org/packages/46/b2/4e28aaffe28db4745ac5df3ee9115719c1b5da5cce4106bee99c82d1eb2c/$sdist
sdist_sha256=e8c517948eff7088a7aa07449aa8eafa4a15a8d50319de2525a6fd26622476c6
proto_jar=spark-udf-worker-proto_2.13-$version.jar
# The four files at the root of $proto_jar.
proto_sha256=(
  "common.proto 2b3677c7a19df91a9afa20e5d8fb4b47f0c1dfc0568d7b8472b73173c103afce"
  "udf_message.proto bae40bad25d7d26733dbad66eea38a21a6c6bc60e0b257061c0ece2a16be21bb"
  "udf_service.proto 96d9c1d5f21d46d02412f3b032992da38dd55a4204a937d3d8b21ab712ad97a1"
  "worker_spec.proto ee6a21eae2491309fa895c9c503861667d4300dc5a3a0ce4b8f8f150598eb06d"
)

cache=${TETHER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tether}
home=$cache/spark-$version
protos=$cache/udf-protos-$version

fail() { echo "spark-oracle: FAILED: $*" >&2; exit 1; }
say() { echo "spark-oracle: $*" >&2; }

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

download() { # URL FILE
  if command -v curl >/dev/null; then
    curl --fail --silent --show-error --location --retry 3 -o "$2" "$1"
  else
    python3 -c 'import shutil, sys, urllib.request
with urllib.request.urlopen(sys.argv[1]) as r, open(sys.argv[2], "wb") as f:
    shutil.copyfileobj(r, f, 1 << 20)' "$1" "$2"
  fi
}

# The distribution's sdist in the cache, its SHA-256 checked once, when it arrives.
fetch_sdist() {
  local file=$cache/downloads/$sdist
  [ -f "$file" ] && return 0
  mkdir -p "$cache/downloads"
  say "downloading $sdist (456 MB) into $cache/downloads"
  download "$sdist_url" "$file.part" || { rm -f "$file.part"; fail "download of $sdist_url failed"; }
  local got; got=$(sha256_of "$file.part")
  if [ "$got" != "$sdist_sha256" ]; then
    rm -f "$file.part"
    fail "$sdist: SHA-256 $got, expected $sdist_sha256 (removed; nothing was unpacked)"
  fi
  mv "$file.part" "$file"
}

# SPARK_HOME: the sdist's deps/ (bin/, sbin/, jars/), unpacked once into $home.
ensure_home() {
  [ -f "$home/.complete" ] && return 0
  fetch_sdist
  local file=$cache/downloads/$sdist
  local got; got=$(sha256_of "$file")
  if [ "$got" != "$sdist_sha256" ]; then
    rm -f "$file"
    fail "$file: SHA-256 $got, expected $sdist_sha256 (removed: run again to download it)"
  fi
  say "unpacking Spark $version into $home"
  local tmp; tmp=$(mktemp -d "$cache/.spark-XXXXXX")
  tar -xzf "$file" -C "$tmp" "pyspark-$version/deps" || { rm -rf "$tmp"; fail "unpacking $file failed"; }
  chmod +x "$tmp/pyspark-$version/deps/bin/"* "$tmp/pyspark-$version/deps/sbin/"* 2>/dev/null || true
  [ -f "$tmp/pyspark-$version/deps/jars/$proto_jar" ] ||
    { rm -rf "$tmp"; fail "$file has no deps/jars/$proto_jar"; }
  touch "$tmp/pyspark-$version/deps/.complete"
  rm -rf "$home"
  mv "$tmp/pyspark-$version/deps" "$home"
  rm -rf "$tmp"
}

# Every pinned .proto file present in $protos with its pinned SHA-256 (else a message).
check_protos() {
  local entry name want got
  for entry in "${proto_sha256[@]}"; do
    name=${entry%% *} want=${entry#* }
    [ -f "$protos/$name" ] || { echo "$protos/$name is missing"; return 1; }
    got=$(sha256_of "$protos/$name")
    [ "$got" = "$want" ] || { echo "$protos/$name: SHA-256 $got, expected $want"; return 1; }
  done
}

ensure_protos() {
  if [ -f "$protos/.complete" ]; then
    local problem
    problem=$(check_protos) || fail "$problem (delete $protos to extract them again)"
    return 0
  fi
  ensure_home
  say "extracting the UDF worker .proto files from $proto_jar into $protos"
  local tmp; tmp=$(mktemp -d "$cache/.protos-XXXXXX")
  local names=("${proto_sha256[@]%% *}")
  python3 - "$home/jars/$proto_jar" "$tmp" "${names[@]}" <<'EOF' || { rm -rf "$tmp"; fail "cannot read $proto_jar"; }
import os, sys, zipfile
jar, out, names = sys.argv[1], sys.argv[2], sys.argv[3:]
with zipfile.ZipFile(jar) as z:
    for name in names:
        with open(os.path.join(out, name), "wb") as f:
            f.write(z.read(name))
EOF
  local problem
  if ! problem=$(protos=$tmp check_protos); then
    rm -rf "$tmp"
    fail "$problem (in $home/jars/$proto_jar)"
  fi
  touch "$tmp/.complete"
  rm -rf "$protos"
  mv "$tmp" "$protos"
}

server() { # start|rotate PORT [--conf k=v ...]
  local mode=$1 port=$2; shift 2
  command -v java >/dev/null || fail "no java on PATH (the Spark $version server needs java 17)"
  ensure_home
  local dir=$cache/connect-server
  local pidfile=$dir/server-$port.pid log=$dir/server-$port.log
  mkdir -p "$dir"
  local extra=()
  if [ "$mode" = rotate ]; then
    extra+=(--conf spark.connect.execute.reattachable.senderMaxStreamDuration=1s
            --conf spark.connect.execute.reattachable.senderMaxStreamSize=123)
  fi
  SPARK_HOME=$home nohup "$home/bin/spark-submit" \
    --class org.apache.spark.sql.connect.service.SparkConnectServer \
    --master 'local[2]' --name tether-oracle --driver-memory 1g \
    --conf spark.ui.enabled=false \
    --conf spark.connect.grpc.binding.address=127.0.0.1 \
    --conf spark.connect.grpc.binding.port="$port" \
    "${extra[@]}" "$@" /dev/null >"$log" 2>&1 &
  echo $! >"$pidfile"
  local _
  for _ in $(seq 1 120); do
    if grep -q "Spark Connect server started" "$log" 2>/dev/null; then
      echo "ready 127.0.0.1:$port"; return 0
    fi
    if ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
      tail -20 "$log" >&2
      fail "the Spark Connect server exited; see $log"
    fi
    sleep 1
  done
  fail "the Spark Connect server did not start within 120 s; see $log"
}

cmd=${1:-}
shift || true
case "$cmd" in
  home) ensure_home; echo "$home" ;;
  protos)
    if [ "${1:-}" = --cached ]; then
      [ -f "$protos/.complete" ] || { say "$protos not fetched (run: bash scripts/spark-oracle.sh protos)"; exit 3; }
      problem=$(check_protos) || fail "$problem (delete $protos to extract them again)"
    else
      ensure_protos
    fi
    echo "$protos" ;;
  start|rotate) port=${1:-15002}; shift || true; server "$cmd" "$port" "$@" ;;
  stop)
    pidfile=$cache/connect-server/server-${1:-15002}.pid
    if [ -f "$pidfile" ]; then kill "$(cat "$pidfile")" 2>/dev/null || true; rm -f "$pidfile"; fi ;;
  *) echo "usage: $0 home | protos [--cached] | start|rotate [PORT] [--conf k=v ...] | stop [PORT]" >&2
     exit 2 ;;
esac
