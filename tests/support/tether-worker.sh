#!/usr/bin/env bash
# Runs the udf test binary ($1) as a real tether UDF worker: its `dispatcher::worker_mode`
# test (ignored in normal runs) serves the echo UDF with `endpoint::serve` on the socket path
# the dispatcher passes as `--connection`.
set -eu
bin="$1"; shift
while [ $# -gt 0 ]; do
  case "$1" in
    --id) export TETHER_TEST_WORKER_ID="$2"; shift 2 ;;
    --connection) export TETHER_TEST_WORKER_CONNECTION="$2"; shift 2 ;;
    *) shift ;;
  esac
done
exec "$bin" dispatcher::worker_mode --exact --ignored --nocapture --test-threads=1
