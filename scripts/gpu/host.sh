#!/usr/bin/env bash
# GPU-host side of the H200 offload A/B run through kvgate. Two commands, back to back (the host keeps files
# only ~30 s between commands, and one transfer carries < 64 MiB):
#   bash scripts/gpu/host.sh part1   # carry .stage/p1: unpack vLLM part 1 and the model dir into $KVG
#   bash scripts/gpu/host.sh run     # carry .stage/p2: unpack part 2, install wheels, start both vLLM
#                                    # servers and kvgate, run the scenario, write $OUT/results.tar.gz
# Env: KVG (scratch outside the repo, default /tmp/kvg), STAGE (default .stage), OUT (default $KVG/out),
#      SCENARIO (default loadtests/scenarios/h200-offload-ab.yaml), FAKE_VLLM=1 (CPU dry run on kvgate sim),
#      PY (python, default python3), SKIP_INSTALL=1 (dry run: use PY's own packages).
set -uo pipefail
ACTION=${1:?part1|run}
export KVG=${KVG:-/tmp/kvg}
STAGE=$(cd "${STAGE:-.stage}" 2>/dev/null && pwd || echo "${STAGE:-.stage}")
OUT=${OUT:-$KVG/out}
export PY=${PY:-python3}
SCENARIO=${SCENARIO:-loadtests/scenarios/h200-offload-ab.yaml}
T0=$(date +%s)
mkdir -p "$KVG/logs" "$OUT"
log() { echo "[$(( $(date +%s) - T0 ))s] $*"; }

unpack() {  # unpack ARCHIVE.tar.xz DIR (Python's tarfile where there is no xz)
  if command -v xz > /dev/null; then xz -dc -T0 "$1" | tar -x -C "$2"
  else "$PY" -c "import sys, tarfile; tarfile.open(sys.argv[1], 'r:xz').extractall(sys.argv[2])" "$1" "$2"; fi
}

part1() {
  mkdir -p "$KVG/vllm-site"
  unpack "$STAGE/p1/vllm-a.tar.xz" "$KVG/vllm-site" || exit 11
  rm -rf "$KVG/model" && cp -r "$STAGE/p1/model" "$KVG/model" || exit 12
  touch "$KVG/part1.ok"
  du -sh "$KVG/vllm-site" "$KVG/model"
  { nvidia-smi; "$PY" -V; "$PY" -m pip list 2>/dev/null | grep -iE "^(torch|triton|numpy|transformers|tokenizers) "; } \
    > "$OUT/host-part1.txt" 2>&1
  log "part 1 unpacked"
}

install_all() {
  [ -f "$KVG/part1.ok" ] || { echo "part 1 is missing from $KVG: run 'host.sh part1' first, right before" >&2; exit 20; }
  rm -rf "$KVG/src" && mkdir -p "$KVG/src" "$KVG/gw-site"
  tar -xzf "$STAGE/p2/src.tar.gz" -C "$KVG/src" || exit 21
  if [ -z "${SKIP_INSTALL:-}" ]; then
    unpack "$STAGE/p2/vllm-b.tar.xz" "$KVG/vllm-site" || exit 22
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$KVG/vllm-site" \
      "$STAGE"/p2/vllm-whl/*.whl || exit 23
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$KVG/gw-site" \
      "$STAGE"/p2/gw-whl/*.whl $(sed "s|^|$STAGE/p2/vllm-whl/|" "$STAGE/p2/gw-whl/shared.txt") || exit 24
  fi
  log "installed"
}

gw() { PYTHONPATH=$KVG/gw-site:$KVG/src PYTHONUNBUFFERED=1 "$PY" "$@"; }

wait_health() {  # wait_health URL SECONDS
  local deadline=$(( $(date +%s) + $2 ))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    gw -c "import sys,httpx; sys.exit(0 if httpx.get(sys.argv[1], timeout=2).status_code == 200 else 1)" "$1" \
      2>/dev/null && return 0
    sleep 1
  done
  return 1
}

run_all() {
  install_all
  local SRV="bash $KVG/src/scripts/gpu/vllm_server.sh"
  $SRV start offload; sleep 3; $SRV start control
  log "vLLM servers starting"
  cd "$KVG/src" || exit 25
  gw -m gateway.devtools.loadtest "$SCENARIO" --write-policies "$KVG/policies" \
    --upstream offload=http://127.0.0.1:8000 --upstream control=http://127.0.0.1:8001 \
    --kv-events offload=tcp://127.0.0.1:5557 --kv-events control=tcp://127.0.0.1:5559 || exit 26
  KVGATE_SALT_SECRET=$(gw -c "import secrets; print(secrets.token_hex(32))") KVGATE_STATE_PATH=$KVG/ledger.sqlite3 \
    KVGATE_LOG_FORMAT=json setsid bash -c "PYTHONPATH=$KVG/gw-site:$KVG/src PYTHONUNBUFFERED=1 exec $PY -m gateway serve \
      --policies $KVG/policies --port 8080" >> "$KVG/logs/gateway.log" 2>&1 < /dev/null &
  echo $! > "$KVG/gateway.pid"
  wait_health http://127.0.0.1:8080/livez 60 || { log "gateway did not start"; tail -30 "$KVG/logs/gateway.log"; }
  log "gateway up"
  if wait_health http://127.0.0.1:8000/health "${WAITUP:-300}" && wait_health http://127.0.0.1:8001/health 120; then
    log "vLLM servers up"
    grep -hE "GPU KV cache size|OffloadingConnector|CPUOffloadingSpec|FlashAttention version|Allocating" \
      "$KVG/logs/offload.log" | head -12
    (timeout "${SCENARIO_T:-420}" env PYTHONPATH="$KVG/gw-site:$KVG/src" PYTHONUNBUFFERED=1 \
      "$PY" -m gateway.devtools.loadtest "$SCENARIO" --out "$KVG/report" --plain \
      --gateway http://127.0.0.1:8080 --access "$KVG/policies/keys.json" \
      --upstream offload=http://127.0.0.1:8000 --upstream control=http://127.0.0.1:8001 \
      --pid-file offload="$KVG/offload.pid" --pid-file control="$KVG/control.pid" \
      --restart-cmd "offload=$SRV restart offload" --restart-cmd "control=$SRV restart control" \
      2>&1 | tee "$KVG/logs/loadtest.log")
    log "scenario finished"
  else
    log "vLLM servers did not come up"; tail -60 "$KVG/logs/offload.log"; tail -30 "$KVG/logs/control.log"
  fi
  collect
}

collect() {
  local pid
  pid=$(cat "$KVG/gateway.pid" 2>/dev/null) && kill -TERM -- "-$pid" 2>/dev/null
  bash "$KVG/src/scripts/gpu/vllm_server.sh" stop offload; bash "$KVG/src/scripts/gpu/vllm_server.sh" stop control
  { date -u +%FT%TZ; cat "$KVG/src/REVISION" 2>/dev/null; "$PY" -V
    [ -z "${FAKE_VLLM:-}" ] && PYTHONPATH=$KVG/vllm-site "$PY" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; uname -a
    gw -m pip list --path "$KVG/gw-site" 2>/dev/null; } > "$KVG/logs/versions.txt" 2>&1
  mkdir -p "$KVG/bundle"
  cp -r "$KVG/report" "$KVG/bundle/report" 2>/dev/null
  cp -r "$KVG/logs" "$KVG/bundle/logs"
  cp "$KVG/policies/gateway.yaml" "$KVG/bundle/logs/gateway.yaml" 2>/dev/null
  tar -czf "$OUT/results.tar.gz" -C "$KVG/bundle" .
  cp "$KVG/report/report.json" "$KVG/report/report.md" "$OUT/" 2>/dev/null
  tail -c 60000 "$KVG/logs/offload.log" > "$OUT/offload_tail.log" 2>/dev/null
  ls -la "$OUT"; log "collected"
}

case $ACTION in
  part1) part1 ;;
  run) run_all ;;
  *) echo "unknown action $ACTION" >&2; exit 2 ;;
esac
