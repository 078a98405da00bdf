#!/usr/bin/env bash
# A stand-in UDF worker for the dispatcher tests (tests/udf/dispatcher.rs). It speaks no
# protocol: the tests pair it with a transport whose readiness is "the socket file exists".
#
# Arguments: whatever the runner spec lists, then `--id ID --connection PATH` (appended by
# the dispatcher). Behaviour is chosen by environment variables (the spec's runner env):
#   STUB_MODE   ready (default)  create PATH, then sleep until signalled
#               ignore-term      like ready, but ignore SIGTERM (only SIGKILL stops it)
#               child            like ready, plus a background child that ignores SIGTERM; its
#                                pid goes to the file STUB_CHILD_PID
#               exit             print "fatal: bad config" to stderr, exit with STUB_EXIT_CODE (42)
#               silent           never create PATH, sleep until signalled
#   STUB_ARGS   if set, every argument is written to this file, one per line
set -u
id="" conn=""
args=("$@")
while [ $# -gt 0 ]; do
  case "$1" in
    --id) id="$2"; shift 2 ;;
    --connection) conn="$2"; shift 2 ;;
    *) shift ;;
  esac
done
if [ -n "${STUB_ARGS:-}" ]; then
  printf '%s\n' "${args[@]}" > "$STUB_ARGS"
fi
echo "stub worker $id starting (mode ${STUB_MODE:-ready})"
case "${STUB_MODE:-ready}" in
  ready)
    : > "$conn"
    exec sleep 600 ;;
  ignore-term)
    trap '' TERM
    : > "$conn"
    exec sleep 600 ;;
  child)
    (trap '' TERM; exec sleep 600) &
    echo $! > "$STUB_CHILD_PID"
    : > "$conn"
    wait ;;
  exit)
    echo "fatal: bad config" >&2
    exit "${STUB_EXIT_CODE:-42}" ;;
  silent)
    exec sleep 600 ;;
  *)
    echo "unknown STUB_MODE ${STUB_MODE}" >&2
    exit 2 ;;
esac
