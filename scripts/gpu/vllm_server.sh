#!/usr/bin/env bash
# Start, stop or restart one arm's vLLM 0.25.0 server on the GPU host (also the runner's restart hook).
#   vllm_server.sh start|stop|restart offload|control
# offload: port 8000, KV events PUB 5557 / replay 5558, OffloadingConnector with a 12 GB CPU tier (64-token blocks;
#          CPU_BYTES=<bytes> sets another size)
# control: port 8001, KV events PUB 5559 / replay 5560, no connector
# Each server runs in its own session (setsid) so the whole tree (API server + engine core) stops together;
# its PID goes to $KVG/<arm>.pid, its output is appended to $KVG/logs/<arm>.log.
# FAKE_VLLM=1 runs `kvgate sim` with the same ports instead (the CPU dry run of scripts/gpu/host.sh).
set -uo pipefail
ACTION=${1:?start|stop|restart}
ARM=${2:?offload|control}
KVG=${KVG:-/tmp/kvg}
PY=${PY:-python3}
PIDFILE=$KVG/$ARM.pid
mkdir -p "$KVG/logs"

case $ARM in
  offload) PORT=8000; EVENTS=5557 ;;
  control) PORT=8001; EVENTS=5559 ;;
  *) echo "unknown arm $ARM" >&2; exit 2 ;;
esac
KV_EVENTS="{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:$EVENTS\",\"replay_endpoint\":\"tcp://*:$((EVENTS + 1))\",\"topic\":\"kv\"}"
CPU_BYTES=${CPU_BYTES:-12000000000}  # the offload arm's tier; a reuse scenario's runner sets it per run
CONNECTOR="{\"kv_connector\":\"OffloadingConnector\",\"kv_role\":\"kv_both\",\"kv_connector_extra_config\":{\"block_size\":64,\"cpu_bytes_to_use\":$CPU_BYTES}}"

server_argv() {
  if [ -n "${FAKE_VLLM:-}" ]; then
    ARGV=("$PY" -m gateway sim --port "$PORT" --model m --gpu-blocks 1271 --seed 0
          --kv-events-endpoint "tcp://*:$EVENTS" --kv-events-replay-endpoint "tcp://*:$((EVENTS + 1))"
          --kv-events-topic kv --prefill-us-per-token 27)
    [ "$ARM" = offload ] && ARGV+=(--offload --cpu-bytes-to-use "$CPU_BYTES")
    return
  fi
  ARGV=("$PY" -m vllm.entrypoints.cli.main serve "$KVG/model" --port "$PORT"
        --load-format dummy --enforce-eager --max-model-len 16384 --gpu-memory-utilization 0.35
        --enable-prefix-caching --enable-prompt-tokens-details --kv-cache-memory-bytes 3000000000
        --served-model-name m --seed 0 --kv-events-config "$KV_EVENTS")
  [ "$ARM" = offload ] && ARGV+=(--kv-transfer-config "$CONNECTOR")
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
    VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 CUDA_VISIBLE_DEVICES=0
  [ -n "${FAKE_VLLM:-}" ] && export PYTHONPATH=$KVG/gw-site:$KVG/src
  return 0
}

start_server() {
  server_argv
  server_env
  echo "=== $(date -u +%FT%TZ) start: ${ARGV[*]}" >> "$KVG/logs/$ARM.log"
  echo "${ARGV[*]}" >> "$KVG/logs/commands.txt"
  setsid "${ARGV[@]}" >> "$KVG/logs/$ARM.log" 2>&1 < /dev/null &
  echo $! > "$PIDFILE"
}

case $ACTION in
  start) start_server ;;
  stop) stop_server ;;
  restart) stop_server; start_server ;;
  *) echo "unknown action $ACTION" >&2; exit 2 ;;
esac
