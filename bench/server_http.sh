#!/bin/bash
# `llmgw server`'s own HTTP: wrk against /v1/models (the router app) and /healthz (the REST API),
# at 32 connections and at 1, the server pinned to core 0 and wrk to core 1. An empty data dir:
# nothing to route, so this is the HTTP server and the apps alone.
#   bench/server_http.sh [SOURCE_DIR]   (default: this checkout; a `git worktree` of another commit to compare)
set -euo pipefail
SRC=$(cd "${1:-$(dirname "$0")/..}" && pwd)
PY=${PYTHON:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}
D=$(mktemp -d)
P=$(( 20000 + RANDOM % 20000 ))
cd "$SRC"
PYTHONPATH=$SRC taskset -c 0 "$PY" -c "import sys; from llmgw.cli.main import main; sys.exit(main())" \
  server --data-dir "$D" --http-port $P --agent-port $(( P + 1 )) > "$D/log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$D"' EXIT
for _ in $(seq 100); do curl -s -o /dev/null http://127.0.0.1:$P/healthz && break; sleep 0.1; done
sleep 1
for c in 32 1; do
  for path in /v1/models /healthz; do
    rps=$(taskset -c 1 wrk -t1 -c$c -d4s http://127.0.0.1:$P$path | awk '/Requests\/sec/ {print $2}')
    echo "$SRC c=$c $path $rps req/s"
  done
done
