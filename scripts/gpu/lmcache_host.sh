#!/usr/bin/env bash
# GPU-host side of the LMCache run (issue 16): vLLM 0.25.0 with LMCache 0.5.6 in-process (LMCacheConnectorV1),
# a control vLLM without a connector, kvgate in front, and scripts/gpu/lmcache_client.py through it.
# Calls, back to back on one warm machine (files under $KVG survive between calls; each carry < 64 MiB):
#   1. carry .stage/p1                          bash scripts/gpu/host.sh part1        (vLLM part 1, model dir)
#   2. no carry                                 bash scripts/gpu/lmcache_host.sh probe  (what the image has)
#   3. carry .stage/lmcache/cupy-a              bash scripts/gpu/lmcache_host.sh stash  (skip 3-4 if the probe
#   4. carry .stage/lmcache/cupy-b, whl-cuda    bash scripts/gpu/lmcache_host.sh stash   shows cupy 14 + cuda 13)
#   5. carry .stage/lmcache/whl                 bash scripts/gpu/lmcache_host.sh install (joins cupy, installs
#                                               into $KVG/lmc-site, import-checks LMCache under vLLM)
#   6. carry .stage/p2                          bash scripts/gpu/lmcache_host.sh run    (servers, gateway, client,
#                                               $OUT/lmcache-results.tar.gz; MP=1 adds the multi-process phase)
# Staging: scripts/gpu/stage.sh (vLLM) and scripts/gpu/lmcache_wheels.sh (LMCache). numpy 2.2.6 and protobuf 6
# live in $KVG/lmc-site, first on PYTHONPATH of the LMCache server only; the control server and kvgate keep the
# image's numpy 2.5.2 and protobuf 7.
# Env: KVG (default /tmp/kvg), STAGE (default .stage), OUT (default $KVG/out), PY (default python3),
#      FAKE_VLLM=1 (CPU dry run: `kvgate sim --lmcache --lmcache-ignore-salt` and a plain sim instead of vLLM),
#      SKIP_INSTALL=1 (use PY's own packages), MP=1 (also run LMCache's multi-process mode), TOKENS (8000),
#      LM_PORT/CTL_PORT/GW_PORT/EV_PORT (8000/8001/8080/5557; the replay port is EV_PORT + 1).
set -uo pipefail
ACTION=${1:?probe|stash|install|run}
export KVG=${KVG:-/tmp/kvg}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
STAGE=$(cd "${STAGE:-$ROOT/.stage}" 2>/dev/null && pwd || echo "${STAGE:-$ROOT/.stage}")
OUT=${OUT:-$KVG/out}
export PY=${PY:-python3}
LMC=$KVG/lmc-carry
LM_PORT=${LM_PORT:-8000} CTL_PORT=${CTL_PORT:-8001} GW_PORT=${GW_PORT:-8080} EV_PORT=${EV_PORT:-5557}
LM=http://127.0.0.1:$LM_PORT CTL=http://127.0.0.1:$CTL_PORT GW=http://127.0.0.1:$GW_PORT
T0=$(date +%s)
mkdir -p "$KVG/logs" "$OUT" "$LMC"
log() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
KV_EVENTS="{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:$EV_PORT\",\"replay_endpoint\":\"tcp://*:$((EV_PORT + 1))\",\"topic\":\"kv\"}"
COMMON=(--load-format dummy --enforce-eager --max-model-len 16384 --gpu-memory-utilization 0.35
        --enable-prefix-caching --enable-prompt-tokens-details --kv-cache-memory-bytes 3000000000
        --served-model-name m --seed 0)

probe() {  # which of LMCache's needs the image already has
  { nvidia-smi -L; "$PY" -V
    "$PY" -m pip list 2>/dev/null | grep -iE "^(cupy|cuda|numpy|protobuf|prometheus|transformers|psutil|aiohttp|pyyaml|requests|sortedcontainers|cryptography|aiofile|nvtx|numba|torch) "
  } 2>&1 | tee "$OUT/lmcache-probe.txt"
}

stash() {  # keep whatever LMCache parts this call carried
  for d in cupy-a cupy-b whl whl-cuda whl-mp; do
    [ -d "$STAGE/lmcache/$d" ] && cp -r "$STAGE/lmcache/$d" "$LMC/" && log "stashed $d"
  done
  ls -la "$LMC"/* 2>/dev/null | tail -n +1
}

install_lmcache() {
  stash
  local wheels=("$LMC"/whl/*.whl)
  [ -d "$LMC/whl-cuda" ] && wheels+=("$LMC"/whl-cuda/*.whl)
  [ -d "$LMC/whl-mp" ] && wheels+=("$LMC"/whl-mp/*.whl)
  if ls "$LMC"/cupy-a/*.part-a > /dev/null 2>&1 && ls "$LMC"/cupy-b/*.part-b > /dev/null 2>&1; then
    local name; name=$(basename "$(ls "$LMC"/cupy-b/*.sha256)" .sha256)
    cat "$LMC"/cupy-a/*.part-a "$LMC"/cupy-b/*.part-b > "$LMC/$name"
    (cd "$LMC" && sha256sum -c "cupy-b/$name.sha256") || { log "cupy wheel does not match its sha256"; exit 31; }
    wheels+=("$LMC/$name")
  fi
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$KVG/lmc-site" \
    "${wheels[@]}" || exit 32
  PYTHONPATH=$KVG/lmc-site:$KVG/vllm-site "$PY" - <<'PYCODE' 2>&1 | tee "$OUT/lmcache-install.txt"
import importlib, traceback
for name in ("numpy", "torch", "lmcache", "lmcache.v1.cache_engine", "lmcache.integration.vllm.vllm_v1_adapter",
             "vllm.distributed.kv_transfer.kv_connector.v1.lmcache_connector",
             "lmcache.integration.vllm.lmcache_mp_connector", "cupy", "cuda.bindings.runtime"):
    try:
        module = importlib.import_module(name)
        print("OK  ", name, getattr(module, "__version__", ""))
    except Exception as error:
        print("FAIL", name, type(error).__name__, error)
        traceback.print_exc(limit=-2)
PYCODE
  log "lmcache installed"
}

install_vllm_and_gateway() {  # as host.sh does for part 2 (vLLM's second half, its wheels, kvgate's wheels)
  [ -n "${SKIP_INSTALL:-}" ] && return 0
  xz -dc -T0 "$STAGE/p2/vllm-b.tar.xz" | tar -x -C "$KVG/vllm-site" || exit 41
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$KVG/vllm-site" \
    "$STAGE"/p2/vllm-whl/*.whl || exit 42
  mkdir -p "$KVG/gw-site"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$KVG/gw-site" \
    "$STAGE"/p2/gw-whl/*.whl $(sed "s|^|$STAGE/p2/vllm-whl/|" "$STAGE/p2/gw-whl/shared.txt") || exit 43
}

gw() { PYTHONPATH=$KVG/gw-site:$ROOT PYTHONUNBUFFERED=1 "$PY" "$@"; }

wait_health() {  # wait_health URL SECONDS
  local deadline=$(( $(date +%s) + $2 ))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    gw -c "import sys,httpx; sys.exit(0 if httpx.get(sys.argv[1], timeout=2).status_code == 200 else 1)" "$1" \
      2>/dev/null && return 0
    sleep 1
  done
  return 1
}

start() {  # start NAME ARGV...: in its own session, output to $KVG/logs/NAME.log, pid to $KVG/NAME.pid
  local name=$1; shift
  echo "$*" >> "$KVG/logs/commands.txt"
  setsid "$@" >> "$KVG/logs/$name.log" 2>&1 < /dev/null &
  echo $! > "$KVG/$name.pid"
}

stop() { local pid; pid=$(cat "$KVG/$1.pid" 2>/dev/null) && kill -TERM -- "-$pid" 2>/dev/null; sleep 3; kill -KILL -- "-$pid" 2>/dev/null; true; }

lmcache_env() {  # LMCache in-process configuration, by environment (LMCache reads LMCACHE_*)
  export LMCACHE_CHUNK_SIZE=256 LMCACHE_LOCAL_CPU=True LMCACHE_MAX_LOCAL_CPU_SIZE=${LMCACHE_CPU_GB:-12} \
    LMCACHE_ENABLE_KV_EVENTS=True LMCACHE_TRACK_USAGE=false LMCACHE_USE_EXPERIMENTAL=True \
    PROMETHEUS_MULTIPROC_DIR=$KVG/prom
  rm -rf "$KVG/prom" && mkdir -p "$KVG/prom"
}

VLLM_ENV=(PYTHONHASHSEED=0 PYTHONUNBUFFERED=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1
          TRANSFORMERS_OFFLINE=1 CUDA_VISIBLE_DEVICES=0 VLLM_USE_FLASHINFER_SAMPLER=0)

start_lmcache_vllm() {  # start_lmcache_vllm CONNECTOR: the LMCache server sees LMCache's own site dir first
  start lmcache env PYTHONPATH="$KVG/lmc-site:$KVG/vllm-site" "${VLLM_ENV[@]}" "$PY" -m vllm.entrypoints.cli.main \
    serve "$KVG/model" --port "$LM_PORT" "${COMMON[@]}" --kv-events-config "$KV_EVENTS" \
    --kv-transfer-config "{\"kv_connector\":\"$1\",\"kv_role\":\"kv_both\"}"
}

start_servers() {
  if [ -n "${FAKE_VLLM:-}" ]; then
    start lmcache env PYTHONPATH="$KVG/gw-site:$ROOT" "$PY" -m gateway sim --port "$LM_PORT" --model m --gpu-blocks 1271 --lmcache --lmcache-ignore-salt \
      --kv-events-endpoint "tcp://*:$EV_PORT" --kv-events-replay-endpoint "tcp://*:$((EV_PORT + 1))" \
      --kv-events-topic kv
    start control env PYTHONPATH="$KVG/gw-site:$ROOT" "$PY" -m gateway sim --port "$CTL_PORT" --model m --gpu-blocks 1271
    return
  fi
  lmcache_env
  start_lmcache_vllm LMCacheConnectorV1
  sleep 3  # two engines allocating at the same instant on one GPU is what the recipe avoids
  start control env PYTHONPATH="$KVG/vllm-site" "${VLLM_ENV[@]}" "$PY" -m vllm.entrypoints.cli.main serve \
    "$KVG/model" --port "$CTL_PORT" "${COMMON[@]}"
}

start_gateway() {
  rm -rf "$KVG/policies" "$KVG"/ledger.sqlite3* && gw "$ROOT/scripts/gpu/lmcache_client.py" policies "$KVG/policies" \
    --lm "$LM" --control "$CTL" --events "tcp://127.0.0.1:$EV_PORT" || exit 51
  gw -m gateway policy check "$KVG/policies" 2>&1 | tee "$OUT/policy-check.txt"
  local secret; secret=$(gw -c "import secrets; print(secrets.token_hex(32))")
  start gateway env PYTHONPATH="$KVG/gw-site:$ROOT" PYTHONUNBUFFERED=1 KVGATE_SALT_SECRET="$secret" \
    KVGATE_STATE_PATH="$KVG/ledger.sqlite3" "$PY" -m gateway serve --policies "$KVG/policies" --port "$GW_PORT"
  wait_health "$GW/livez" 60 || { log "gateway did not start"; tail -30 "$KVG/logs/gateway.log"; collect; exit 52; }
}

client() {  # client PHASE
  (cd "$ROOT" && timeout "${CLIENT_T:-300}" env PYTHONPATH="$KVG/gw-site:$ROOT" PYTHONUNBUFFERED=1 "$PY" \
    scripts/gpu/lmcache_client.py run --gateway "$GW" --keys "$KVG/policies/keys.json" \
    --lm "$LM" --control "$CTL" --out "$KVG/report/$1" --tokens "${TOKENS:-8000}") \
    2>&1 | tee "$KVG/logs/client-$1.log"
  gw -c "import sys,httpx; sys.stdout.write(httpx.get(sys.argv[1], timeout=10).text)" "$LM/metrics" \
    > "$KVG/report/$1/lmcache_server_metrics.txt" 2>/dev/null
}

mp_phase() {  # LMCache multi-process: an `lmcache server` and vLLM with LMCacheMPConnector on port 8000
  stop lmcache
  lmcache_env
  # LMCache 0.5.6's server: ZMQ on 5555 (LMCacheMPConnector's default), first tier in host memory, /metrics from
  # its OpenTelemetry Prometheus exporter on MP_METRICS_PORT (needs the whl-mp wheels)
  start lmcache-server env PYTHONPATH="$KVG/lmc-site:$KVG/vllm-site" CUDA_VISIBLE_DEVICES=0 "$PY" \
    -m lmcache.v1.multiprocess.server --port 5555 --l1-size-gb "${LMCACHE_CPU_GB:-12}" \
    --prometheus-port "${MP_METRICS_PORT:-9090}"
  sleep 5  # the server binds before vLLM's connector first connects; vLLM's own start-up takes far longer
  start_lmcache_vllm LMCacheMPConnector
  if wait_health "$LM/health" "${WAITUP:-300}"; then
    client mp
    gw -c "import sys,httpx; sys.stdout.write(httpx.get(sys.argv[1], timeout=10).text)" \
      "http://127.0.0.1:${MP_METRICS_PORT:-9090}/metrics" > "$KVG/report/mp/lmcache_server_own_metrics.txt" 2>&1
    gw -c "import sys; from gateway.connectors.cache_server import cache_server_memory as m; print(m(open(sys.argv[1]).read()))" \
      "$KVG/report/mp/lmcache_server_own_metrics.txt" | tee "$KVG/report/mp/cache_server_memory.txt"
  else
    log "MP vLLM did not start"; tail -60 "$KVG/logs/lmcache.log"; tail -40 "$KVG/logs/lmcache-server.log"
  fi
}

run_all() {
  install_vllm_and_gateway
  start_servers
  start_gateway
  if wait_health "$LM/health" "${WAITUP:-300}" && wait_health "$CTL/health" 120; then
    log "servers up"
    grep -hiE "LMCache|KV connector|GPU KV cache size" "$KVG/logs/lmcache.log" | head -20
    client in-process
    [ -n "${MP:-}" ] && mp_phase
  else
    log "servers did not come up"; tail -80 "$KVG/logs/lmcache.log"; tail -20 "$KVG/logs/control.log"
  fi
  collect
}

collect() {
  stop gateway; stop lmcache; stop control; stop lmcache-server
  { date -u +%FT%TZ; git -C "$ROOT" rev-parse HEAD 2>/dev/null; "$PY" -V
    [ -z "${FAKE_VLLM:-}" ] && PYTHONPATH=$KVG/lmc-site:$KVG/vllm-site "$PY" -c \
      "import vllm, torch, lmcache, numpy; print('vllm', vllm.__version__, 'torch', torch.__version__, 'numpy', numpy.__version__)"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; } > "$KVG/logs/versions.txt" 2>&1
  mkdir -p "$KVG/bundle" && cp -r "$KVG/report" "$KVG/logs" "$KVG/bundle/" 2>/dev/null
  cp "$KVG/policies/gateway.yaml" "$KVG/bundle/logs/" 2>/dev/null
  tar -czf "$OUT/lmcache-results.tar.gz" -C "$KVG/bundle" .
  cp "$KVG"/report/*/results.md "$OUT/" 2>/dev/null
  ls -la "$OUT"; log "collected"
}

case $ACTION in
  probe) probe ;;
  stash) stash ;;
  install) install_lmcache ;;
  run) run_all ;;
  *) echo "unknown action $ACTION" >&2; exit 2 ;;
esac
