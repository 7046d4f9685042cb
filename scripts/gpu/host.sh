#!/usr/bin/env bash
# GPU-host side of the H200 runs through kvgate: real vLLM 0.25.0 servers, kvgate in front, the scenario runner.
# The host keeps files only ~30 s between commands and one transfer carries < 64 MiB, so a session is a few
# commands back to back (scripts/gpu/RUNBOOK.md has the exact calls):
#   bash scripts/gpu/host.sh part1          # carry .stage/p1: unpack vLLM part 1 and the model dir into $KVG
#   bash scripts/gpu/host.sh run            # carry .stage/p2: unpack part 2, install wheels, start the servers,
#                                           # run every scenario in $SCENARIOS, write the results into $OUT
#   bash scripts/gpu/host.sh lmcache-part   # carry .stage/lmcache/cupy-a: keep the first half of a split wheel
#   bash scripts/gpu/host.sh lmcache-build  # carry .stage/lmcache/{whl,src}: install lmcache into its own site dir,
#                                           # probe it; rebuild its extensions against the host's torch if needed
#   bash scripts/gpu/host.sh lmcache        # (no carry after lmcache-build) run $SCENARIOS (default: the
#                                           # lmcache scenario) with the LMCache server; installs first if needed
# `lmcache` reuses the vLLM install of a `run` (or `install`) on the same, still warm, machine.
#
# Env: KVG (scratch outside the repo, default /tmp/kvg), STAGE (default .stage), OUT (default $KVG/out),
#      SCENARIOS (space-separated scenario files, each optionally PATH@cpu_bytes_to_use=N[/M]@runner=hotscan
#      @fresh=reset|restart|keep; see scripts/gpu/runplan.py), DEADLINE_S (seconds after start by which results
#      must be packed, default 550), RUN_T (longest one scenario may take, default 330), WAITUP (longest wait for a
#      booting server, 240),
#      AFTER_RUN (shell run after each scenario while its gateway is up; sees RUN, RUN_DIR, KEYS and run_env's
#      variables: GATEWAY, OFFLOAD_URL, POLICIES, ...),
#      FAKE_VLLM=1 (CPU dry run on kvgate sim), PY (python, default python3), SKIP_INSTALL=1 (use PY's packages).
#
# Time budget of `run` (one command may take 600 s; DEADLINE_S leaves ~50 s of margin, and collect() always runs):
#   unpack + pip install                          ~10 s
#   both servers healthy (started together)       83-98 s measured on 2026-11-29 (WAITUP bounds it)
#   per scenario: gateway restart ~3 s, /reset_prefix_cache < 1 s, metrics/version captures ~1 s,
#                 the scenario itself (sized by its file; RUN_T and the deadline bound it)
#   an arm whose setting changes between scenarios: stop ≤ 60 s (usually ~5 s) + boot 60-90 s (a 12 GB pinned
#                 CPU tier alone takes 13-22 s to allocate)
#   collect: stop everything, pack                ~10 s
# A scenario that cannot start with at least MIN_RUN_S (default 60) left before the deadline is skipped and says so.
set -uo pipefail
ACTION=${1:?part1|run|install|lmcache-part|lmcache-build|lmcache}
export KVG=${KVG:-/tmp/kvg}
STAGE=$(cd "${STAGE:-.stage}" 2>/dev/null && pwd || echo "${STAGE:-.stage}")
export OUT=${OUT:-$KVG/out}
export PY=${PY:-python3}
DEADLINE=$(( $(date +%s) + ${DEADLINE_S:-550} ))
T0=$(date +%s)
ARMS=(offload control)
mkdir -p "$KVG/logs" "$KVG/runs" "$OUT"
log() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( DEADLINE - $(date +%s) )); }

unpack() {  # unpack ARCHIVE.tar.xz DIR (Python's tarfile where there is no xz)
  if command -v xz > /dev/null; then xz -dc -T0 "$1" | tar -x -C "$2"
  else "$PY" -c "import sys, tarfile; tarfile.open(sys.argv[1], 'r:xz').extractall(sys.argv[2])" "$1" "$2"; fi
}

part1() {
  mkdir -p "$KVG/vllm-site"
  unpack "$STAGE/p1/vllm-a.tar.xz" "$KVG/vllm-site" || exit 11
  rm -rf "$KVG/model" && mkdir -p "$KVG/model"
  if [ -f "$STAGE/p1/model.tar.xz" ]; then unpack "$STAGE/p1/model.tar.xz" "$KVG/model" || exit 12
  else cp -r "$STAGE/p1/model/." "$KVG/model/" || exit 12; fi
  touch "$KVG/part1.ok"
  du -sh "$KVG/vllm-site" "$KVG/model"
  { nvidia-smi; "$PY" -V; "$PY" -m pip list 2>/dev/null \
      | grep -iE "^(torch|triton|numpy|transformers|tokenizers|protobuf|cupy-cuda13x|cuda-bindings|cuda-python|prometheus.client|setuptools) "
  } > "$OUT/host-part1.txt" 2>&1
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
  touch "$KVG/install.ok"
  log "installed"
}

gw() { PYTHONPATH=$KVG/gw-site:$KVG/src PYTHONUNBUFFERED=1 "$PY" "$@"; }
srv() { bash "$KVG/src/scripts/gpu/vllm_server.sh" "$@"; }
port_of() { [ "$1" = offload ] && echo 8000 || echo 8001; }
events_of() { [ "$1" = offload ] && echo 5557 || echo 5559; }

wait_health() {  # wait_health URL SECONDS [PIDFILE]: 200 from URL in time; gives up at once if PIDFILE's group died
  local deadline=$(( $(date +%s) + $2 ))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    gw -c "import sys,httpx; sys.exit(0 if httpx.get(sys.argv[1], timeout=2).status_code == 200 else 1)" "$1" \
      2>/dev/null && return 0
    if [ -n "${3:-}" ] && ! kill -0 -- "-$(cat "$3" 2>/dev/null || echo 0)" 2>/dev/null; then
      log "the process behind $1 exited"; return 1
    fi
    sleep 1
  done
  return 1
}

wait_servers() {  # wait_servers SECONDS ARM...: every given arm healthy within SECONDS (one shared deadline)
  local until=$(( $(date +%s) + $1 )) arm; shift
  for arm in "$@"; do
    wait_health "http://127.0.0.1:$(port_of "$arm")/health" $(( until - $(date +%s) )) "$KVG/$arm.pid" \
      || { log "$arm did not come up"; tail -40 "$KVG/logs/$arm.log"; return 1; }
  done
  log "healthy: $*"
}

capture() {  # capture DIR TAG: every server's /version and /metrics into DIR/<arm>-<TAG>.{version.json,prom}
  local arm
  for arm in "${ARMS[@]}"; do
    gw - "http://127.0.0.1:$(port_of "$arm")" "$1/$arm-$2" <<'EOF'
import sys, httpx
base, stem = sys.argv[1], sys.argv[2]
for route, suffix in (("/version", ".version.json"), ("/metrics", ".prom")):
    try:
        answer = httpx.get(base + route, timeout=10)
        body = answer.text if answer.status_code == 200 else f"HTTP {answer.status_code}\n{answer.text[:2000]}"
    except httpx.HTTPError as error:
        body = f"unreachable: {error!r}\n"
    with open(stem + suffix, "w") as out:
        out.write(body)
EOF
    { echo "== $arm $2 $(srv setting "$arm") $(head -c 300 "$1/$arm-$2.version.json")"
      grep -E "^vllm:(cache_config_info|kv_offload_[a-z_]*bytes_total|prefix_cache_(queries|hits)_total|external_prefix_cache_(queries|hits)_total|prompt_tokens_by_source_total)|^lmcache:.*(hit|stored|retrieve).*_total" \
        "$1/$arm-$2.prom" | head -40
    } >> "$OUT/servers.txt" 2>/dev/null
  done
}

start_gateway() {  # start_gateway RUN_DIR
  KVGATE_SALT_SECRET=$(gw -c "import secrets; print(secrets.token_hex(32))") KVGATE_STATE_PATH=$1/ledger.sqlite3 \
    KVGATE_LOG_FORMAT=json setsid bash -c "PYTHONPATH=$KVG/gw-site:$KVG/src PYTHONUNBUFFERED=1 exec $PY -m gateway serve \
      --policies $1/policies --port 8080" >> "$1/gateway.log" 2>&1 < /dev/null &
  echo $! > "$KVG/gateway.pid"
  wait_health http://127.0.0.1:8080/livez 60 || { log "gateway did not start"; tail -30 "$1/gateway.log"; return 1; }
}

stop_gateway() {
  local pid
  pid=$(cat "$KVG/gateway.pid" 2>/dev/null) || return 0
  kill -TERM -- "-$pid" 2>/dev/null
  for _ in $(seq 1 100); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL -- "-$pid" 2>/dev/null; rm -f "$KVG/gateway.pid"
}

prepare_servers() {  # prepare_servers OFFLOAD_SETTING CONTROL_SETTING FRESH RUN_DIR: restart what must change
  local want=("$1" "$2") fresh=$3 restart=() arm i
  [ -n "${JUST_BOOTED:-}" ] && fresh=keep   # the first run gets servers started for it: nothing to empty yet
  JUST_BOOTED=
  for i in 0 1; do
    arm=${ARMS[$i]}
    if [ ! -f "$KVG/$arm.pid" ] || [ "$(srv setting "$arm")" != "${want[$i]}" ] || [ "$fresh" = restart ]; then
      [ ${#restart[@]} -gt 0 ] && sleep 3   # two engines allocating at the same instant is what the recipe avoids
      restart+=("$arm"); SETTING=${want[$i]} srv restart "$arm"
    elif [ "$fresh" = reset ]; then
      echo "$arm reset: $(srv reset "$arm")" | tee -a "$4/notes.txt"
    fi
  done
  [ ${#restart[@]} -eq 0 ] && return 0
  log "(re)starting ${restart[*]} with offload=$1 control=$2"
  echo "restarted: ${restart[*]}" >> "$4/notes.txt"
  local budget=$(( $(left) - ${MIN_RUN_S:-60} ))
  [ "$budget" -gt "${WAITUP:-240}" ] && budget=${WAITUP:-240}
  wait_servers "$budget" "${restart[@]}"
}

run_env() {  # run_env RUN_DIR SCENARIO: what a runner's commands see (runplan.py writes them; see server.py)
  export SCENARIO=$2 POLICIES=$1/policies REPORT=$1/report GATEWAY=http://127.0.0.1:8080 \
    OFFLOAD_URL=http://127.0.0.1:8000 CONTROL_URL=http://127.0.0.1:8001 \
    OFFLOAD_EVENTS=tcp://127.0.0.1:5557 CONTROL_EVENTS=tcp://127.0.0.1:5559 \
    OFFLOAD_PIDFILE=$KVG/offload.pid CONTROL_PIDFILE=$KVG/control.pid \
    RESTART_OFFLOAD="bash $KVG/src/scripts/gpu/vllm_server.sh restart offload" \
    RESTART_CONTROL="bash $KVG/src/scripts/gpu/vllm_server.sh restart control" \
    RESET_OFFLOAD="bash $KVG/src/scripts/gpu/vllm_server.sh reset offload" \
    RESET_CONTROL="bash $KVG/src/scripts/gpu/vllm_server.sh reset control" \
    ENSURE_OFFLOAD="bash $KVG/src/scripts/gpu/vllm_server.sh ensure offload"
}

run_one() {  # run_one RUN SCENARIO_COPY OFFLOAD_SETTING CONTROL_SETTING FRESH RUNNER
  local run=$1 dir=$KVG/runs/$1 t_start; t_start=$(date +%s)
  mkdir -p "$dir"
  if [ "$(left)" -lt "${MIN_RUN_S:-60}" ]; then
    log "$run: skipped, $(left) s left before the deadline"; echo "| $run | skipped (deadline) | | |" >> "$OUT/summary.md"; return
  fi
  log "=== $run ($6): offload=$3 control=$4 fresh=$5"
  if ! prepare_servers "$3" "$4" "$5" "$dir"; then
    echo "| $run | servers did not come up | $(( $(date +%s) - t_start )) s | |" >> "$OUT/summary.md"; return
  fi
  run_env "$dir" "$2"
  PYTHONPATH=$KVG/gw-site:$KVG/src PYTHONUNBUFFERED=1 bash "$KVG/plan/$run.policies.sh" > "$dir/policies.log" 2>&1 \
    || { tail -5 "$dir/policies.log"; echo "| $run | policy write failed | | |" >> "$OUT/summary.md"; return; }
  start_gateway "$dir" || { echo "| $run | gateway did not start | | |" >> "$OUT/summary.md"; return; }
  capture "$dir" before
  local limit=$(( $(left) - 15 )) rc
  [ "$limit" -gt "${RUN_T:-330}" ] && limit=${RUN_T:-330}
  if [ "$limit" -lt 10 ]; then   # a restart or a slow gateway start ate the time this run had
    stop_gateway; log "$run: skipped, $(left) s left after preparing it"
    echo "| $run | skipped (deadline, after preparing) | $(( $(date +%s) - t_start )) s | offload=$3 control=$4 |" \
      >> "$OUT/summary.md"
    return
  fi
  log "$run: traffic (at most $limit s): $(head -c 200 "$KVG/plan/$run.run.sh")"
  local capturer=""
  if [ -n "${CAPTURE_EVENTS:-}" ]; then   # the offload server's KV-event stream, verbatim, for a fixture
    gw "$KVG/src/scripts/gpu/capture_kv_events.py" --endpoint "tcp://127.0.0.1:$(events_of offload)" \
      --out "$dir/kv-events.jsonl" --seconds "$limit" > "$dir/capture.log" 2>&1 &
    capturer=$!
  fi
  PYTHONPATH=$KVG/gw-site:$KVG/src PYTHONUNBUFFERED=1 timeout "$limit" bash "$KVG/plan/$run.run.sh" > "$dir/loadtest.log" 2>&1
  rc=$?
  if [ -n "$capturer" ]; then kill -TERM "$capturer" 2>/dev/null; wait "$capturer" 2>/dev/null; fi
  tail -15 "$dir/loadtest.log"
  capture "$dir" after
  if [ -n "${AFTER_RUN:-}" ]; then
    RUN=$run RUN_DIR=$dir KEYS=$dir/policies/keys.json timeout 60 bash -c "$AFTER_RUN" > "$dir/after_run.log" 2>&1
    tail -5 "$dir/after_run.log"
  fi
  stop_gateway
  local verdict="rc $rc$([ "$rc" = 124 ] && echo ' (timed out)')"
  echo "| $run | $verdict | $(( $(date +%s) - t_start )) s | offload=$3 control=$4 |" >> "$OUT/summary.md"
  { echo; echo "# $run ($6, $verdict)"; echo
    cat "$dir/report/report.md" 2>/dev/null || cat "$dir/report/summary.md" 2>/dev/null || tail -40 "$dir/loadtest.log"
  } >> "$OUT/reports.md"
  log "$run: done, $verdict"
}

fresh_dirs() {  # an earlier command on this machine left runs and logs: move them aside, out of this bundle
  [ -n "$(ls -A "$KVG/runs" 2>/dev/null)" ] || return 0
  local previous; previous=$KVG/previous-$(date +%s)
  mkdir -p "$previous" && mv "$KVG/runs" "$KVG/logs" "$previous/" && rm -rf "$KVG/plan"
  mkdir -p "$KVG/runs" "$KVG/logs"
}

run_scenarios() {  # plan the runs, boot the servers for the first, run each, collect
  local entries=${SCENARIOS:-loadtests/scenarios/plan-h200.yaml loadtests/scenarios/admission-h200.yaml}
  fresh_dirs
  printf '| run | result | wall | servers |\n| --- | --- | --- | --- |\n' > "$OUT/summary.md"
  cd "$KVG/src" || exit 25
  # shellcheck disable=SC2086  # the entries are words on purpose
  if ! gw scripts/gpu/runplan.py "$KVG/plan" $entries > "$KVG/runs.tsv" 2> "$KVG/logs/runplan.log"; then
    cat "$KVG/logs/runplan.log"; echo "| runplan | failed: $(head -c 300 "$KVG/logs/runplan.log") | | |" >> "$OUT/summary.md"
    collect; exit 26
  fi
  log "runs:"; cut -f1,3- "$KVG/runs.tsv"
  local first_offload first_control
  IFS=$'\t' read -r _ _ first_offload first_control _ < "$KVG/runs.tsv"
  SETTING=$first_offload srv start offload; sleep 3; SETTING=$first_control srv start control
  log "vLLM servers starting"
  if wait_servers "${WAITUP:-240}" "${ARMS[@]}"; then
    grep -hE "GPU KV cache size|OffloadingConnector|CPUOffloadingSpec|LMCache|FlashAttention version|Allocating" \
      "$KVG/logs/offload.log" | head -12
    capture "$KVG/runs" boot
    JUST_BOOTED=1
    local run scenario offload control fresh runner
    while IFS=$'\t' read -r run scenario offload control fresh runner; do
      run_one "$run" "$scenario" "$offload" "$control" "$fresh" "$runner" < /dev/null
    done < "$KVG/runs.tsv"
  else
    echo "| boot | servers did not come up in ${WAITUP:-240} s | | |" >> "$OUT/summary.md"
    tail -60 "$KVG/logs/offload.log"; tail -30 "$KVG/logs/control.log"
  fi
  collect
}

lmcache_install() {  # lmcache and the wheels the image lacks (or pins differently) into $KVG/lmcache-site
  [ -f "$KVG/install.ok" ] || { echo "no vLLM install in $KVG: run 'host.sh run' or 'install' first, on this machine" >&2; exit 30; }
  local wheels=("$STAGE"/lmcache/whl/*.whl)
  if [ -f "$KVG/cupy-parts/part-a" ] && compgen -G "$STAGE/lmcache/cupy-b/*.part-b" > /dev/null; then
    local b name; b=$(echo "$STAGE"/lmcache/cupy-b/*.part-b); name=$(basename "$b" .part-b)
    cat "$KVG/cupy-parts/part-a" "$b" > "$KVG/cupy-parts/$name"
    (cd "$KVG/cupy-parts" && sha256sum -c "$STAGE/lmcache/cupy-b/$name.sha256") || exit 31
    wheels+=("$KVG/cupy-parts/$name")
  fi
  rm -rf "$KVG/lmcache-site" "$KVG/lmcache.ok" && mkdir -p "$KVG/lmcache-site"
  if [ -z "${SKIP_INSTALL:-}" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$KVG/lmcache-site" "${wheels[@]}" \
      || exit 32
  fi
  log "lmcache installed ($(ls "$KVG/lmcache-site" | wc -l) entries)"
}

lmcache_probe() {  # lmcache_probe TAG: import what the in-process connector needs, with the vLLM server's PYTHONPATH
  # torch first: lmcache's four extensions link libtorch, and their failure to load (an undefined symbol when
  # built against another torch) is what this is for. 0 when the connector's path imports.
  { echo "== $1 ($(date -u +%T))"
    PYTHONPATH=$KVG/lmcache-site:$KVG/vllm-site "$PY" - 2>&1 <<'EOF'
import importlib, traceback
for name in ("numpy", "google.protobuf", "prometheus_client", "torch", "cupy", "cuda.bindings", "lmcache",
             "lmcache.cuda_ops", "lmcache.lmcache_native", "lmcache.lmcache_fs", "lmcache.lmcache_redis",
             "lmcache.integration.vllm.vllm_v1_adapter", "vllm.distributed.kv_transfer.kv_connector.v1.lmcache_connector"):
    try:
        module = importlib.import_module(name)
        print("ok  ", name, getattr(module, "__version__", ""), getattr(module, "__file__", ""))
    except Exception:
        print("FAIL", name); traceback.print_exc(limit=2)
EOF
  } >> "$OUT/lmcache-probe.txt"
  local section; section=$(sed -n "/^== $1/,\$p" "$OUT/lmcache-probe.txt")   # (no grep -q on a pipe: pipefail)
  grep -E "^(ok|FAIL|==)|Error" <<< "$section"
  ! grep -qE "^FAIL (lmcache|lmcache.cuda_ops|lmcache.integration.vllm.vllm_v1_adapter|vllm.distributed.*)$" <<< "$section"
}

lmcache_build() {  # rebuild lmcache's torch extensions against the host's torch, sm_90 only, into lmcache-site
  [ -f "$STAGE/lmcache/src/lmcache-src.tar.gz" ] || { log "no lmcache source carried (.stage/lmcache/src)"; return 1; }
  local b=$KVG/lmc-build t0; t0=$(date +%s)
  rm -rf "$b" && mkdir -p "$b/src" "$b/tools" && tar -xzf "$STAGE/lmcache/src/lmcache-src.tar.gz" -C "$b/src" || return 1
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$b/tools" "$STAGE"/lmcache/src/tools/*.whl || return 1
  [ -d /usr/local/cuda ] && export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} PATH=$PATH:/usr/local/cuda/bin
  log "building lmcache's extensions against torch $("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null \
    || echo '(none importable)') with nvcc at $(command -v nvcc || echo '(none on PATH)')"
  (cd "$b/src" && PYTHONPATH=$b/tools TORCH_CUDA_ARCH_LIST=9.0 BUILD_WITH_CUDA=1 timeout "${BUILD_T:-420}" \
     "$PY" setup.py build_ext --inplace) > "$KVG/logs/lmcache-build.log" 2>&1
  local rc=$?
  tail -c 30000 "$KVG/logs/lmcache-build.log" > "$OUT/lmcache-build.log"
  log "build rc $rc in $(( $(date +%s) - t0 )) s: $(cd "$b/src" && ls lmcache/*.so 2>/dev/null | tr '\n' ' ')"
  [ "$rc" = 0 ] || return 1
  cp "$b"/src/lmcache/*.so "$KVG/lmcache-site/lmcache/"
}

lmcache_ready() {  # install, probe; rebuild the extensions when the wheel's do not load; $KVG/lmcache.ok on success
  lmcache_install
  if lmcache_probe wheel || [ -n "${FAKE_VLLM:-}" ]; then touch "$KVG/lmcache.ok"; return 0; fi
  if ! grep -qE "^FAIL lmcache\.(cuda_ops|lmcache_[a-z]+)$" <<< "$(sed -n '/^== wheel/,$p' "$OUT/lmcache-probe.txt")"; then
    log "lmcache fails for another reason than its extensions: no rebuild (see lmcache-probe.txt)"; return 1
  fi
  log "the wheel's extensions do not load here ($(grep -c "undefined symbol" "$OUT/lmcache-probe.txt") undefined-symbol errors): rebuilding"
  if lmcache_build && lmcache_probe rebuilt; then touch "$KVG/lmcache.ok"; return 0; fi
  return 1
}

collect() {
  stop_gateway
  local arm; for arm in "${ARMS[@]}"; do srv stop "$arm"; done
  { date -u +%FT%TZ; cat "$KVG/src/REVISION" 2>/dev/null; "$PY" -V
    [ -z "${FAKE_VLLM:-}" ] && PYTHONPATH=$KVG/vllm-site "$PY" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; uname -a
    gw -m pip list --path "$KVG/gw-site" 2>/dev/null; } > "$KVG/logs/versions.txt" 2>&1
  rm -rf "$KVG/bundle" && mkdir -p "$KVG/bundle"
  cp -r "$KVG/runs" "$KVG/bundle/runs"; cp -r "$KVG/logs" "$KVG/bundle/logs"; cp -r "$KVG/plan" "$KVG/bundle/plan" 2>/dev/null
  find "$KVG/bundle" -name '*.sqlite3*' -size +8M -delete   # ledgers are rebuilt from the captures if needed
  find "$KVG/bundle" -name keys.json -delete   # plain tenant and admin keys stay on the host
  tar -czf "$OUT/results.tar.gz" -C "$KVG/bundle" .
  if [ "$(stat -c %s "$OUT/results.tar.gz")" -gt 15000000 ]; then   # 16 MiB per returned file: cut the big logs
    find "$KVG/bundle" -name '*.log' -size +2M -exec sh -c 'tail -c 2000000 "$1" > "$1.tail" && mv "$1.tail" "$1"' _ {} \;
    tar -czf "$OUT/results.tar.gz" -C "$KVG/bundle" .
  fi
  for arm in "${ARMS[@]}"; do tail -c 60000 "$KVG/logs/$arm.log" > "$OUT/${arm}_tail.log" 2>/dev/null; done
  # At most 8 files come back: the log tails go first (the full logs are in results.tar.gz).
  [ "$(ls "$OUT" | wc -l)" -gt 8 ] && rm -f "$OUT/control_tail.log"
  [ "$(ls "$OUT" | wc -l)" -gt 8 ] && rm -f "$OUT/offload_tail.log"
  ls -la "$OUT"; log "collected"
}

case $ACTION in
  part1) part1 ;;
  run) install_all; run_scenarios ;;
  install) install_all ;;   # a cold machine before `lmcache`: part1, then install (carry .stage/p2), then lmcache
  lmcache-part)  # keep the first half of a split wheel outside the tree the next transfer replaces
    mkdir -p "$KVG/cupy-parts" && cat "$STAGE"/lmcache/cupy-a/*.part-a > "$KVG/cupy-parts/part-a" || exit 33
    ls -la "$KVG/cupy-parts"; log "part a kept" ;;
  lmcache-build) lmcache_ready; log "lmcache ready: $([ -f "$KVG/lmcache.ok" ] && echo yes || echo no)" ;;
  lmcache)
    fresh_dirs
    if [ ! -f "$KVG/lmcache.ok" ] && ! lmcache_ready && [ -z "${FORCE:-}" ]; then
      # a server that cannot import the connector dies after minutes of start-up: spend no device time on it
      log "lmcache does not import with vLLM's PYTHONPATH: not starting the servers (FORCE=1 to try anyway)"
      collect; exit 34
    fi
    SCENARIOS=${SCENARIOS:-loadtests/scenarios/lmcache-h200-client.yaml} run_scenarios ;;
  *) echo "unknown action $ACTION" >&2; exit 2 ;;
esac
