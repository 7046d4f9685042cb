#!/usr/bin/env bash
# Start, stop, restart or reset one arm's vLLM 0.25.0 server on the GPU host (also the runner's restart hook).
#   vllm_server.sh start|stop|restart|ensure|reset|setting offload|control
# offload: port 8000, KV events PUB 5557 / replay 5558     control: port 8001, KV events PUB 5559 / replay 5560
# What an arm runs with is a SETTING: `none`, `offloading:CPU_BYTES` (the OffloadingConnector, 64-token blocks) or
# `lmcache:CPU_BYTES` (LMCacheConnectorV1 with a CPU tier of that size, lmcache's packages in $KVG/lmcache-site).
# `start` takes $SETTING if set, else (offload arm) offloading:$CPU_BYTES if that is set, else the arm's last one
# ($KVG/<arm>.setting), else the default (offload: offloading:12000000000, control: none), and records it, so a
# bare `restart` (the runner's hook) keeps it. `ensure` restarts only when the wanted setting differs from what
# runs (else it resets, below): a runner that restarts before each tier size loses no time on the first.
# `reset` empties the GPU prefix cache and the connector's tier: POST /reset_prefix_cache?reset_external=true
# (a vLLM dev-mode route: every server runs with VLLM_SERVER_DEV_MODE=1 on this isolated host).
# Each server runs in its own session (setsid) so the whole tree (API server + engine core) stops together;
# its PID goes to $KVG/<arm>.pid, its output is appended to $KVG/logs/<arm>.log.
# FAKE_VLLM=1 runs `kvgate sim` with the same ports instead (the CPU dry run of scripts/gpu/host.sh).
set -uo pipefail
ACTION=${1:?start|stop|restart|ensure|reset|setting}
ARM=${2:?offload|control}
KVG=${KVG:-/tmp/kvg}
PY=${PY:-python3}
PIDFILE=$KVG/$ARM.pid
mkdir -p "$KVG/logs"

case $ARM in
  offload) PORT=8000; EVENTS=5557; DEFAULT_SETTING=offloading:12000000000 ;;
  control) PORT=8001; EVENTS=5559; DEFAULT_SETTING=none ;;
  *) echo "unknown arm $ARM" >&2; exit 2 ;;
esac
KV_EVENTS="{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:$EVENTS\",\"replay_endpoint\":\"tcp://*:$((EVENTS + 1))\",\"topic\":\"kv\"}"

current_setting() {
  if [ -n "${SETTING:-}" ]; then echo "$SETTING"
  elif [ -n "${CPU_BYTES:-}" ] && [ "$ARM" = offload ]; then echo "offloading:$CPU_BYTES"
  elif [ -f "$KVG/$ARM.setting" ]; then cat "$KVG/$ARM.setting"
  else echo "$DEFAULT_SETTING"; fi
}

server_argv() {  # server_argv SETTING -> ARGV, and EXTRA_ENV for lmcache
  local connector=${1%%:*} bytes=${1#*:}
  EXTRA_ENV=()
  if [ -n "${FAKE_VLLM:-}" ]; then
    ARGV=("$PY" -m gateway sim --port "$PORT" --model m --gpu-blocks 1271 --seed 0
          --kv-events-endpoint "tcp://*:$EVENTS" --kv-events-replay-endpoint "tcp://*:$((EVENTS + 1))"
          --kv-events-topic kv --prefill-us-per-token 27)
    [ "$connector" = offloading ] && ARGV+=(--offload --cpu-bytes-to-use "$bytes")
    if [ "$connector" = lmcache ]; then   # the simulator's LMCache mode where it has one, else its CPU tier
      if grep -qE -- '--lmcache[] ]' <<< "$(PYTHONPATH=$KVG/gw-site:$KVG/src "$PY" -m gateway sim --help 2>/dev/null)"; then
        ARGV+=(--lmcache)
      else ARGV+=(--offload --cpu-bytes-to-use "$bytes"); fi
    fi
    return
  fi
  ARGV=("$PY" -m vllm.entrypoints.cli.main serve "$KVG/model" --port "$PORT"
        --load-format dummy --enforce-eager --max-model-len 16384 --gpu-memory-utilization 0.35
        --enable-prefix-caching --enable-prompt-tokens-details --kv-cache-memory-bytes 3000000000
        --served-model-name m --seed 0 --kv-events-config "$KV_EVENTS")
  case $connector in
    none) ;;
    offloading)
      ARGV+=(--kv-transfer-config "{\"kv_connector\":\"OffloadingConnector\",\"kv_role\":\"kv_both\",\"kv_connector_extra_config\":{\"block_size\":64,\"cpu_bytes_to_use\":$bytes}}") ;;
    lmcache)
      # LMCache reads its settings from LMCACHE_* variables: 256-token chunks, a CPU tier of $bytes (in GB, its
      # unit), no disk or remote tier, its KV events on (vLLM publishes them with its own), no usage reporting.
      ARGV+=(--kv-transfer-config '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}')
      # Its Prometheus counters live in the engine-core process: a multiprocess directory lets the API server's
      # /metrics show them (lmcache:*), as the lmcache helper's host script does.
      rm -rf "$KVG/prom-$ARM" && mkdir -p "$KVG/prom-$ARM"
      EXTRA_ENV=(LMCACHE_CHUNK_SIZE=256 LMCACHE_LOCAL_CPU=True
                 "LMCACHE_MAX_LOCAL_CPU_SIZE=$("$PY" -c "print($bytes / 1e9)")" LMCACHE_MAX_LOCAL_DISK_SIZE=0
                 LMCACHE_ENABLE_KV_EVENTS=True LMCACHE_USE_EXPERIMENTAL=True
                 LMCACHE_TRACK_USAGE=false LMCACHE_LOG_LEVEL=INFO "PROMETHEUS_MULTIPROC_DIR=$KVG/prom-$ARM") ;;
    *) echo "unknown connector in setting $1" >&2; exit 2 ;;
  esac
}

stop_server() {
  [ -f "$PIDFILE" ] || return 0
  local pid; pid=$(cat "$PIDFILE")
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 1 600); do   # up to 60 s for the API server and its engine core to exit (GPU memory freed)
    kill -0 -- "-$pid" 2>/dev/null || { rm -f "$PIDFILE"; return 0; }
    sleep 0.1
  done
  kill -KILL -- "-$pid" 2>/dev/null
  sleep 1; rm -f "$PIDFILE"
}

server_env() {  # the vLLM servers see their own site dir only (kvgate's pins differ, e.g. starlette)
  export PYTHONPATH=$KVG/vllm-site PYTHONHASHSEED=0 PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 \
    VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 CUDA_VISIBLE_DEVICES=0 \
    VLLM_SERVER_DEV_MODE=1
  # lmcache's pins (numpy <= 2.2.6, protobuf < 7) differ from the image's: its site dir goes first, for vLLM only
  [ "${1%%:*}" = lmcache ] && export PYTHONPATH=$KVG/lmcache-site:$KVG/vllm-site
  [ -n "${FAKE_VLLM:-}" ] && export PYTHONPATH=$KVG/gw-site:$KVG/src
  return 0
}

start_server() {
  local setting; setting=$(current_setting)
  server_argv "$setting"
  echo "$setting" > "$KVG/$ARM.setting"
  echo "=== $(date -u +%FT%TZ) start ($setting): ${EXTRA_ENV[*]} ${ARGV[*]}" >> "$KVG/logs/$ARM.log"
  echo "${EXTRA_ENV[*]} ${ARGV[*]}" >> "$KVG/logs/commands.txt"
  ( server_env "$setting"; exec setsid env "${EXTRA_ENV[@]}" "${ARGV[@]}" >> "$KVG/logs/$ARM.log" 2>&1 < /dev/null ) &
  echo $! > "$PIDFILE"
}

reset_server() {  # prints the HTTP status of the reset (or the error) and the engine's own verdict from its log
  # vLLM answers 200 whether or not the reset took; the engine logs "Successfully reset prefix cache" or
  # "Failed to reset prefix cache because some blocks ... are not freed yet".
  "$PY" - "http://127.0.0.1:$PORT/reset_prefix_cache?reset_external=true" <<'EOF' || return 1
import sys, urllib.error, urllib.request
try:
    with urllib.request.urlopen(urllib.request.Request(sys.argv[1], method="POST"), timeout=30) as answer:
        print(answer.status, end=" ")
except (urllib.error.URLError, OSError) as error:
    print(f"failed: {error}")
    sys.exit(1)
EOF
  tail -c 20000 "$KVG/logs/$ARM.log" | grep -oE "(Successfully|Failed to) reset prefix cache.{0,80}" | tail -1
  echo
}

ensure_server() {  # the wanted setting running: reset in place when it already is, else restart
  local pid; pid=$(cat "$PIDFILE" 2>/dev/null)
  if [ -n "$pid" ] && kill -0 -- "-$pid" 2>/dev/null && [ "$(current_setting)" = "$(cat "$KVG/$ARM.setting" 2>/dev/null)" ]
  then echo "$ARM already runs $(current_setting): reset $(reset_server)"
  else stop_server; start_server; fi
}

case $ACTION in
  start) start_server ;;
  ensure) ensure_server ;;
  stop) stop_server ;;
  restart) stop_server; start_server ;;
  reset) reset_server ;;
  setting) current_setting ;;
  *) echo "unknown action $ACTION" >&2; exit 2 ;;
esac
